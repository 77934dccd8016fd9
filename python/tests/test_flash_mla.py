"""smla.flash_mla: FlashMLA's sparse API on FlashMLA-shaped random cases, against the float64 model."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smla  # noqa: E402
import smla.flash_mla as flash_mla  # noqa: E402
from cases import decode_case, prefill_case, step_order_case  # noqa: E402
from conftest import cuda_available, orders_tokens  # noqa: E402
from reference import assert_close, bf16_bits_to_f64  # noqa: E402
from torch_util import assert_permutation, bf16_to_numpy_bits, to_torch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if cuda_available() else [])


def flash_mla_decode(case, b, s_q, device, out=None, sched=None):
    heads = case["q"].shape[1]
    q = to_torch(case["q"], device).view(b, s_q, heads, -1)
    cache = to_torch(case["main_cache"], device).pages.unsqueeze(2)  # [num_blocks, block_size, 1, bytes]
    extra = to_torch(case["extra_cache"], device).pages.unsqueeze(2) if case["extra_cache"] is not None else None
    per_request = lambda lengths: None if lengths is None else to_torch(lengths[::s_q], device)  # noqa: E731
    sched = sched or flash_mla.get_mla_metadata()[0]
    return flash_mla.flash_mla_with_kvcache(
        q, cache, None, None, 512, sched, None, case["softmax_scale"], False, True,
        indices=to_torch(case["main_indices"], device).view(b, s_q, -1), attn_sink=to_torch(case["sink"], device),
        extra_k_cache=extra,
        extra_indices_in_kvcache=None if extra is None else to_torch(case["extra_indices"], device).view(b, s_q, -1),
        topk_length=per_request(case["main_lengths"]), extra_topk_length=per_request(case["extra_lengths"]), out=out)


def check_decode(case, b, s_q, out, lse):
    heads = case["q"].shape[1]
    assert out.shape == (b, s_q, heads, 512) and lse.shape == (b, heads, s_q)
    flat_out = bf16_bits_to_f64(bf16_to_numpy_bits(out)).reshape(b * s_q, heads, 512)
    flat_lse = lse.transpose(1, 2).cpu().numpy().reshape(b * s_q, heads)
    assert_close(flat_out, flat_lse, *case["expected"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", [8, 64, 128])
@pytest.mark.parametrize("s_q", [1, 2])
def test_v4_two_sources_sink_and_per_request_lengths(rng, device, heads, s_q):
    b = 3
    case = decode_case(rng, fmt="v4-fp8", tokens=b * s_q, heads=heads, page_size=4, num_pages=8, k_main=12,
                       extra_page_size=2, extra_pages=9, k_extra=10, length_group=s_q)
    out, lse = flash_mla_decode(case, b, s_q, device)
    check_decode(case, b, s_q, out, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_v32(rng, device):
    b, s_q = 4, 1
    case = decode_case(rng, fmt="v32-fp8", tokens=b, heads=16, extra=False, sink=False, k_main=16)
    out, lse = flash_mla_decode(case, b, s_q, device)
    check_decode(case, b, s_q, out, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_out_in_place_and_sched_meta_reuse(rng, device):
    b, s_q = 2, 2
    case = decode_case(rng, tokens=b * s_q, heads=8, length_group=s_q)
    out = torch.full((b, s_q, 8, 512), float("nan"), dtype=torch.bfloat16, device=device)
    sched = flash_mla.get_mla_metadata()[0]
    got, lse = flash_mla_decode(case, b, s_q, device, out=out, sched=sched)
    assert got is out and sched.have_initialized
    check_decode(case, b, s_q, out, lse)
    got, lse = flash_mla_decode(case, b, s_q, device, sched=sched)  # same shapes: fine
    check_decode(case, b, s_q, got, lse)
    other = decode_case(rng, tokens=b * s_q, heads=16, length_group=s_q)
    with pytest.raises(smla.Error, match="tile_scheduler_metadata"):
        flash_mla_decode(other, b, s_q, device, sched=sched)
    # The step's token order: a buffer of b * s_q on CUDA, none on the CPU.
    if device == "cpu":
        assert sched.token_order is None
    else:
        assert sched.token_order.shape == (b * s_q,) and sched.token_order.dtype == torch.int32


@pytest.mark.parametrize("device", DEVICES)
def test_views_whose_batch_and_seq_dims_do_not_merge(rng, device):
    b, s_q = 3, 2
    case = decode_case(rng, tokens=b * s_q, heads=8, length_group=s_q)
    out, lse = flash_mla_decode(case, b, s_q, device)
    # The same q stored seq-major: [b, s_q] strides that cannot merge without a copy.
    q = to_torch(case["q"], device).view(b, s_q, 8, 512)
    q_seq_major = q.transpose(0, 1).contiguous().transpose(0, 1)
    cache = to_torch(case["main_cache"], device).pages.unsqueeze(2)
    extra = to_torch(case["extra_cache"], device).pages.unsqueeze(2)
    out2, lse2 = flash_mla.flash_mla_with_kvcache(
        q_seq_major, cache, None, None, 512, flash_mla.get_mla_metadata()[0], None, case["softmax_scale"], False,
        True, indices=to_torch(case["main_indices"], device).view(b, s_q, -1), attn_sink=to_torch(case["sink"], device),
        extra_k_cache=extra, extra_indices_in_kvcache=to_torch(case["extra_indices"], device).view(b, s_q, -1),
        topk_length=to_torch(case["main_lengths"][::s_q], device),
        extra_topk_length=to_torch(case["extra_lengths"][::s_q], device))
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device (or smla built without CUDA)")
def test_sched_meta_carries_the_step_token_order(rng):
    """The first call with a FlashMLASchedMeta writes the step's token order into its buffer; the
    later calls (the other layers) read it, as FlashMLA's scheduler metadata is reused."""
    b, s_q = 80, 2
    case = step_order_case(rng, b, s_q)
    sched = flash_mla.get_mla_metadata()[0]
    first = flash_mla_decode(case, b, s_q, "cuda", sched=sched)
    check_decode(case, b, s_q, *first)
    order = sched.token_order
    assert order is not None and order.shape == (b * s_q,) and order.dtype == torch.int32 and order.is_cuda
    written = order.clone()
    if orders_tokens():
        assert_permutation(written)
    later = flash_mla_decode(case, b, s_q, "cuda", sched=sched)  # the next layer: reads the order
    check_decode(case, b, s_q, *later)
    assert sched.token_order is order and torch.equal(order, written)
    assert torch.equal(later[0], first[0]) and torch.equal(later[1], first[1])
    order.fill_(-1)  # a later call only reads it: -1 (the launch order) stays, and gives the same results
    again = flash_mla_decode(case, b, s_q, "cuda", sched=sched)
    assert torch.all(order == -1)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    other = step_order_case(rng, b, s_q)  # same shapes, other lengths: a stale order is only slower
    check_decode(other, b, s_q, *flash_mla_decode(other, b, s_q, "cuda", sched=sched))
    fresh = flash_mla.get_mla_metadata()[0]  # a new step: a new order
    check_decode(other, b, s_q, *flash_mla_decode(other, b, s_q, "cuda", sched=fresh))
    assert fresh.token_order is not order
    if orders_tokens():
        assert_permutation(fresh.token_order)


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device (or smla built without CUDA)")
def test_sched_meta_serves_one_device(rng):
    """A FlashMLASchedMeta holds its first call's token order on that call's device: a call on
    another device with the same shapes is refused by name, not handed a buffer it cannot read."""
    b, s_q = 2, 2
    case = decode_case(rng, tokens=b * s_q, heads=8, length_group=s_q)
    for first, second in (("cuda", "cpu"), ("cpu", "cuda")):
        sched = flash_mla.get_mla_metadata()[0]
        check_decode(case, b, s_q, *flash_mla_decode(case, b, s_q, first, sched=sched))
        with pytest.raises(smla.Error, match="tile_scheduler_metadata: expected q on the device of its first call"):
            flash_mla_decode(case, b, s_q, second, sched=sched)
        check_decode(case, b, s_q, *flash_mla_decode(case, b, s_q, first, sched=sched))  # still serves its own


def test_flash_mla_argument_checks(rng):
    case = decode_case(rng, tokens=2, heads=8, extra=False)
    q = to_torch(case["q"]).view(2, 1, 8, 512)
    cache = to_torch(case["main_cache"]).pages.unsqueeze(2)
    idx = to_torch(case["main_indices"]).view(2, 1, -1)
    sched = flash_mla.get_mla_metadata()[0]
    with pytest.raises(smla.Error, match="dense"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, sched, is_fp8_kvcache=True)
    with pytest.raises(smla.Error, match="head_dim_v"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 256, sched, is_fp8_kvcache=True, indices=idx)
    with pytest.raises(smla.Error, match="k_cache"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, sched, is_fp8_kvcache=False, indices=idx)
    with pytest.raises(smla.Error, match="extra_indices_in_kvcache"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, flash_mla.get_mla_metadata()[0],
                                         is_fp8_kvcache=True, indices=idx, extra_k_cache=cache)
    assert isinstance(smla.Error("x"), RuntimeError)  # code catching FlashMLA's RuntimeError still works


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", [8, 64, 128])
def test_sparse_fwd_with_topk_length(rng, device, heads):
    case = prefill_case(rng, s_q=5, heads=heads, s_kv=24, topk=16)
    q = to_torch(case["q"], device)
    kv = to_torch(case["kv"], device).unsqueeze(1)  # [s_kv, 1, d_qk]
    indices = to_torch(case["indices"], device).unsqueeze(1)  # [s_q, 1, topk]
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, indices, case["softmax_scale"], 512,
                                                          to_torch(case["sink"], device),
                                                          to_torch(case["topk_length"], device))
    assert out.shape == (5, heads, 512) and max_logits.shape == (5, heads) and lse.shape == (5, heads)
    assert_close(bf16_bits_to_f64(bf16_to_numpy_bits(out)), lse.cpu().numpy(), *case["expected"])
    *_, lse_indexer = flash_mla.flash_mla_sparse_fwd(q, kv, indices, case["softmax_scale"], 512, None,
                                                     to_torch(case["topk_length"], device), indexer_topk=4)
    head_case = dict(case, indices=case["indices"][:, :4])
    _, _, lse4 = smla.sparse_prefill(case["q"], case["kv"], head_case["indices"],
                                     topk_length=np.minimum(case["topk_length"], 4),
                                     softmax_scale=case["softmax_scale"])
    # Another backend on the GPU: f32 rounding differs in the last bits.
    assert np.allclose(lse_indexer.cpu().numpy(), lse4, rtol=1e-5, atol=1e-6, equal_nan=True)
