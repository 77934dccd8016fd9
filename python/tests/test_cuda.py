"""smla on CUDA tensors: the float64 model, the caller's stream, graph capture, torch.compile.

Skipped (with the reason shown) where no CUDA device or no CUDA build exists; the GPU machine
runs it through scripts/gpu-check.sh.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smla  # noqa: E402
import smla.torch as smla_torch  # noqa: E402
from cases import decode_case, decode_kwargs, prefill_case, step_order_case  # noqa: E402
from conftest import cuda_available, orders_tokens  # noqa: E402
from reference import assert_close, attend, bf16_bits_to_f64, decode_rows, padded_pages  # noqa: E402
from torch_util import assert_permutation, bf16_to_numpy_bits, to_torch  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA device (or smla built without CUDA)")


def cuda_kwargs(case):
    return {k: v if isinstance(v, float) else to_torch(v, "cuda") for k, v in decode_kwargs(case).items()}


def run_decode(case, **extra):
    return smla_torch.sparse_decode(to_torch(case["q"], "cuda"), to_torch(case["main_cache"], "cuda"),
                                    to_torch(case["main_indices"], "cuda"), **cuda_kwargs(case), **extra)


def check(case, out, lse):
    assert_close(bf16_bits_to_f64(bf16_to_numpy_bits(out)), lse.cpu().numpy(), *case["expected"])


@pytest.mark.parametrize("fmt", ["v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows"])
@pytest.mark.parametrize("heads", [1, 8, 64, 128])
def test_decode_matches_float64_model(rng, fmt, heads):
    case = decode_case(rng, fmt=fmt, tokens=4, heads=heads, page_size=int(rng.choice([1, 3, 64])), num_pages=3,
                       k_main=40, extra_page_size=2, extra_pages=30, k_extra=33)
    out, lse = run_decode(case)
    assert out.is_cuda and lse.is_cuda
    check(case, out, lse)


def test_cuda_equals_generic_api_and_queries_per_request(rng):
    case = decode_case(rng, tokens=6, heads=8)
    a = run_decode(case)
    b = run_decode(case, queries_per_request=2)
    check(case, *a)
    check(case, *b)


def test_prefill_matches_float64_model(rng):
    case = prefill_case(rng, s_q=70, heads=64, s_kv=300, topk=96)
    out, max_logits, lse = smla_torch.sparse_prefill(
        to_torch(case["q"], "cuda"), to_torch(case["kv"], "cuda"), to_torch(case["indices"], "cuda"),
        topk_length=to_torch(case["topk_length"], "cuda"), sink=to_torch(case["sink"], "cuda"),
        softmax_scale=case["softmax_scale"])
    check(case, out, lse)


def test_runs_on_the_current_stream(rng):
    case = decode_case(rng, heads=16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out, lse = run_decode(case)
    side.synchronize()
    check(case, out, lse)


def test_cuda_tensor_to_host_backend_is_an_error(rng):
    case = decode_case(rng, extra=False)
    with pytest.raises(smla.Error, match="cpu"):
        run_decode(case, backend="cpu")


def test_graph_capture_and_replay(rng):
    case = decode_case(rng, tokens=4, heads=64)
    q = to_torch(case["q"], "cuda")
    cache, idx, kwargs = to_torch(case["main_cache"], "cuda"), to_torch(case["main_indices"], "cuda"), cuda_kwargs(case)
    out = torch.empty((4, 64, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((4, 64), dtype=torch.float32, device="cuda")
    smla_torch.sparse_decode(q, cache, idx, out=out, lse=lse, **kwargs)  # warm-up: sizes the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        smla_torch.sparse_decode(q, cache, idx, out=out, lse=lse, **kwargs)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(case, out, lse)
    # New values in the captured buffers: the replay computes the new step.
    other = decode_case(rng, tokens=4, heads=64)
    q.copy_(to_torch(other["q"], "cuda"))
    replay_case = dict(case, q=other["q"])
    from reference import attend, decode_rows  # noqa: E402
    sources = [(lambda s: decode_rows(case["main_cache"].pages, "v4-fp8", s), case["main_indices"],
                case["main_lengths"], case["main_cache"].pages.shape[0] * case["main_cache"].pages.shape[1]),
               (lambda s: decode_rows(case["extra_cache"].pages, "v4-fp8", s), case["extra_indices"],
                case["extra_lengths"], case["extra_cache"].pages.shape[0] * case["extra_cache"].pages.shape[1])]
    replay_case["expected"] = attend(bf16_bits_to_f64(other["q"]), sources, case["sink"], case["softmax_scale"])
    graph.replay()
    torch.cuda.synchronize()
    check(replay_case, out, lse)


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_fullgraph(rng):
    case = decode_case(rng, tokens=4, heads=8)
    q, cache, idx = to_torch(case["q"], "cuda"), to_torch(case["main_cache"], "cuda"), to_torch(case["main_indices"], "cuda")
    kwargs = cuda_kwargs(case)

    def step(q, pages, idx, main_lengths, extra_pages, extra_indices, extra_lengths, sink):
        out, lse = smla_torch.sparse_decode(
            q * 1, smla.KvCache(pages, "v4-fp8"), idx, main_lengths=main_lengths,
            extra_cache=smla.KvCache(extra_pages, "v4-fp8"), extra_indices=extra_indices,
            extra_lengths=extra_lengths, sink=sink, softmax_scale=case["softmax_scale"])
        return out.float() * 2, lse

    compiled = torch.compile(step, fullgraph=True)
    out, lse = compiled(q, cache.pages, idx, kwargs["main_lengths"], kwargs["extra_cache"].pages,
                        kwargs["extra_indices"], kwargs["extra_lengths"], kwargs["sink"])
    eager_out, eager_lse = step(q, cache.pages, idx, kwargs["main_lengths"], kwargs["extra_cache"].pages,
                                kwargs["extra_indices"], kwargs["extra_lengths"], kwargs["sink"])
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    check(case, (out / 2).to(torch.bfloat16), lse)
    assert hasattr(torch.ops.smla, "sparse_decode") and hasattr(torch.ops.smla, "sparse_prefill")


def test_workspace_is_cached_and_reported(rng):
    case = decode_case(rng, tokens=64, heads=128, k_main=128, extra_pages=80, k_extra=512)
    run_decode(case)
    first = smla_torch.workspace_bytes("cuda")
    run_decode(case)
    assert smla_torch.workspace_bytes("cuda") == first
    q = to_torch(case["q"], "cuda")
    out = torch.empty((64, 128, 512), dtype=torch.bfloat16, device="cuda")
    size = smla.sparse_decode_workspace_size(q, to_torch(case["main_cache"], "cuda"),
                                             to_torch(case["main_indices"], "cuda"), out=out, **cuda_kwargs(case))
    assert size <= first


def test_cupy_arrays_through_dlpack_on_a_caller_stream(rng):
    """The framework-neutral route: CuPy arrays (DLPack), caller-owned workspace and stream."""
    cupy = pytest.importorskip("cupy")
    case = decode_case(rng, tokens=4, heads=16, k_main=20)
    dev = lambda a: None if a is None else cupy.asarray(np.ascontiguousarray(a))  # noqa: E731

    def dev_cache(cache):  # the same bytes and strides on the device: pages keep their padded stride
        pages = cache.pages
        return smla.KvCache(cupy.lib.stride_tricks.as_strided(dev(padded_pages(pages)), pages.shape, pages.strides),
                            cache.format)

    q, idx = dev(case["q"]), dev(case["main_indices"])  # bf16 as uint16 bits
    main, extra = dev_cache(case["main_cache"]), dev_cache(case["extra_cache"])
    kwargs = dict(main_lengths=dev(case["main_lengths"]), extra_cache=extra, extra_indices=dev(case["extra_indices"]),
                  extra_lengths=dev(case["extra_lengths"]), sink=dev(case["sink"]),
                  softmax_scale=case["softmax_scale"])
    out = cupy.full((4, 16, 512), 0x7FC0, dtype=cupy.uint16)
    lse = cupy.full((4, 16), np.nan, dtype=cupy.float32)
    size = smla.sparse_decode_workspace_size(q, main, idx, out=out, lse=lse, **kwargs)
    stream = cupy.cuda.Stream(non_blocking=True)
    if size:
        with pytest.raises(smla.Error, match="workspace"):
            smla.sparse_decode(q, main, idx, out=out, lse=lse, stream=stream, **kwargs)
    workspace = cupy.empty(max(size, 1), dtype=cupy.uint8)
    smla.sparse_decode(q, main, idx, out=out, lse=lse, workspace=workspace, stream=stream, **kwargs)
    stream.synchronize()
    assert_close(bf16_bits_to_f64(cupy.asnumpy(out)), cupy.asnumpy(lse), *case["expected"])


def expected_with_lengths(case, main_lengths, extra_lengths):
    """The float64 model of a case with other (not longer) lengths: only rows it selected are read."""
    def source(cache, indices, lengths):
        pages = cache.pages
        return (lambda s: decode_rows(pages, case["fmt"], s), indices, lengths, pages.shape[0] * pages.shape[1])

    return attend(bf16_bits_to_f64(case["q"]), [source(case["main_cache"], case["main_indices"], main_lengths),
                                                source(case["extra_cache"], case["extra_indices"], extra_lengths)],
                  case["sink"], case["softmax_scale"])


def test_step_token_order_written_then_read(rng):
    """The first call of a step (ready=False) writes the order, later calls (ready=True) read it;
    results match the model and never depend on the buffer's contents."""
    b, s_q = 80, 2
    T = b * s_q
    case = step_order_case(rng, b, s_q)
    order = torch.full((T,), -1, dtype=torch.int32, device="cuda")
    first = run_decode(case, queries_per_request=s_q, token_order=order, token_order_ready=False)
    check(case, *first)
    written = order.clone()
    if orders_tokens():
        assert_permutation(written)
    later = run_decode(case, queries_per_request=s_q, token_order=order, token_order_ready=True)
    check(case, *later)
    assert torch.equal(order, written), "a ready call wrote token_order"
    assert torch.equal(later[0], first[0]) and torch.equal(later[1], first[1])
    order.fill_(-1)  # the launch order
    launch = run_decode(case, queries_per_request=s_q, token_order=order, token_order_ready=True)
    assert torch.equal(launch[0], first[0]) and torch.equal(launch[1], first[1])
    assert torch.all(order == -1)
    # Through the generic API too, and a stale order (another step's lengths): slower, never wrong.
    other = step_order_case(rng, b, s_q)
    order.copy_(written)
    out, lse = smla.sparse_decode(to_torch(other["q"], "cuda"), to_torch(other["main_cache"], "cuda"),
                                  to_torch(other["main_indices"], "cuda"), queries_per_request=s_q,
                                  token_order=order, token_order_ready=True, **cuda_kwargs(other))
    check(other, out, lse)
    with pytest.raises(smla.Error, match="token_order"):
        run_decode(case, token_order=order.to(torch.int64))
    with pytest.raises(smla.Error, match="token_order"):
        run_decode(case, token_order=order.cpu())


def test_step_token_order_under_graph_replay(rng):
    """A captured step (the writing call, then a reading one) follows every replay's lengths."""
    b, s_q = 80, 2
    T = b * s_q
    case = step_order_case(rng, b, s_q)
    q = to_torch(case["q"], "cuda")
    cache, idx, kwargs = to_torch(case["main_cache"], "cuda"), to_torch(case["main_indices"], "cuda"), cuda_kwargs(case)
    order = torch.full((T,), -1, dtype=torch.int32, device="cuda")
    outs = [(torch.empty((T, 64, 512), dtype=torch.bfloat16, device="cuda"),
             torch.empty((T, 64), dtype=torch.float32, device="cuda")) for _ in range(2)]

    def step():
        for layer, (out, lse) in enumerate(outs):
            smla_torch.sparse_decode(q, cache, idx, out=out, lse=lse, queries_per_request=s_q, token_order=order,
                                     token_order_ready=layer > 0, **kwargs)

    step()  # warm-up: sizes the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for out, lse in outs:
        out.fill_(float("nan"))
    order.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    for out, lse in outs:
        check(case, out, lse)
    if orders_tokens():
        assert_permutation(order)
    # New (shorter) lengths in the captured buffers: the replay orders the tokens by them.
    main_lengths = rng.integers(0, case["main_lengths"][::s_q] + 1).astype(np.int32).repeat(s_q)
    extra_lengths = rng.integers(0, case["extra_lengths"][::s_q] + 1).astype(np.int32).repeat(s_q)
    kwargs["main_lengths"].copy_(torch.from_numpy(main_lengths))
    kwargs["extra_lengths"].copy_(torch.from_numpy(extra_lengths))
    graph.replay()
    torch.cuda.synchronize()
    replay_case = dict(case, expected=expected_with_lengths(case, main_lengths, extra_lengths))
    for out, lse in outs:
        check(replay_case, out, lse)
    if orders_tokens():
        assert_permutation(order)


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_with_token_order(rng):
    b, s_q = 80, 2
    case = step_order_case(rng, b, s_q)
    q, cache = to_torch(case["q"], "cuda"), to_torch(case["main_cache"], "cuda")
    idx, kwargs = to_torch(case["main_indices"], "cuda"), cuda_kwargs(case)
    order = torch.full((b * s_q,), -1, dtype=torch.int32, device="cuda")

    def step(q, order):
        first = smla_torch.sparse_decode(q * 1, cache, idx, queries_per_request=s_q, token_order=order,
                                         token_order_ready=False, **kwargs)
        later = smla_torch.sparse_decode(q * 1, cache, idx, queries_per_request=s_q, token_order=order,
                                         token_order_ready=True, **kwargs)
        return first, later

    compiled = torch.compile(step, fullgraph=True)
    first, later = compiled(q, order)
    check(case, *first)
    check(case, *later)
    assert torch.equal(first[0], later[0]) and torch.equal(first[1], later[1])
    if orders_tokens():
        assert_permutation(order)  # the op's mutation reaches the caller's buffer
