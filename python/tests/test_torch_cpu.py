"""smla.torch and the generic API with torch CPU tensors (Debian's torch 1.13 here)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smla  # noqa: E402
import smla.torch as smla_torch  # noqa: E402
from cases import decode_case, decode_kwargs, prefill_case  # noqa: E402
from reference import assert_close, bf16_bits_to_f64  # noqa: E402
from torch_util import bf16_to_numpy_bits, to_torch  # noqa: E402


def torch_kwargs(case, device="cpu"):
    return {k: to_torch(v, device) if not isinstance(v, float) else v for k, v in decode_kwargs(case).items()}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("fmt", ["v4-fp8", "v32-fp8", "bf16-rows"])
def test_torch_decode_equals_numpy_bits(rng, backend, fmt):
    case = decode_case(rng, fmt=fmt)
    np_out, np_lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], backend=backend,
                                        **decode_kwargs(case))
    out, lse = smla_torch.sparse_decode(to_torch(case["q"]), to_torch(case["main_cache"]),
                                        to_torch(case["main_indices"]), backend=backend, **torch_kwargs(case))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert np.array_equal(bf16_to_numpy_bits(out), np_out)
    assert np.array_equal(lse.numpy(), np_lse)
    assert_close(bf16_bits_to_f64(np_out), np_lse, *case["expected"])


def test_generic_api_routes_torch_tensors(rng):
    case = decode_case(rng, extra=False)
    out, lse = smla.sparse_decode(to_torch(case["q"]), to_torch(case["main_cache"]), to_torch(case["main_indices"]),
                                  **torch_kwargs(case))
    assert isinstance(out, torch.Tensor)
    assert_close(bf16_bits_to_f64(bf16_to_numpy_bits(out)), lse.numpy(), *case["expected"])


def test_torch_out_in_place_and_non_contiguous_views(rng):
    case = decode_case(rng, heads=4)
    q = to_torch(case["q"])
    wide = torch.zeros((q.shape[0], q.shape[1] * 2, q.shape[2]), dtype=torch.bfloat16)
    wide[:, ::2] = q
    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((q.shape[0], q.shape[1]), float("nan"))
    got = smla_torch.sparse_decode(wide[:, ::2], to_torch(case["main_cache"]), to_torch(case["main_indices"]),
                                   out=out, lse=lse, **torch_kwargs(case))
    assert got[0] is out and got[1] is lse
    assert_close(bf16_bits_to_f64(bf16_to_numpy_bits(out)), lse.numpy(), *case["expected"])


def test_torch_prefill(rng):
    case = prefill_case(rng)
    out, max_logits, lse = smla_torch.sparse_prefill(
        to_torch(case["q"]), to_torch(case["kv"]), to_torch(case["indices"]),
        topk_length=to_torch(case["topk_length"]), sink=to_torch(case["sink"]), softmax_scale=case["softmax_scale"])
    assert_close(bf16_bits_to_f64(bf16_to_numpy_bits(out)), lse.numpy(), *case["expected"])


def test_torch_bad_inputs(rng):
    case = decode_case(rng, extra=False)
    q, cache, idx = to_torch(case["q"]), to_torch(case["main_cache"]), to_torch(case["main_indices"])
    with pytest.raises(smla.Error, match="q"):
        smla_torch.sparse_decode(q.float(), cache, idx)
    with pytest.raises(smla.Error, match="main_indices"):
        smla_torch.sparse_decode(q, cache, idx.long())
    with pytest.raises(smla.Error, match="q: expected a CPU or CUDA tensor"):
        smla_torch.sparse_decode(q.to("meta"), cache, idx)
    with pytest.raises(smla.Error, match="main_indices"):
        smla_torch.sparse_decode(q, cache, idx.to(torch.int8))
    with pytest.raises(smla.Error, match="cuda"):
        smla_torch.sparse_decode(q, cache, idx, backend="cuda")
    with pytest.raises(smla.Error, match="main_cache"):
        smla_torch.sparse_decode(q, smla.KvCache(torch.zeros(2, 2, 3, 584, dtype=torch.uint8)), idx)


@pytest.mark.parametrize("dtype_name", ["uint8", "int8", "float8_e4m3fn"])
def test_byte_cache_dtypes_give_the_same_bits(rng, dtype_name):
    dtype = getattr(torch, dtype_name, None)
    if dtype is None:
        pytest.skip(f"torch {torch.__version__} has no {dtype_name}")
    case = decode_case(rng, extra=False)
    q, idx = to_torch(case["q"]), to_torch(case["main_indices"])
    cache = to_torch(case["main_cache"])
    kwargs = torch_kwargs(case)
    base_out, base_lse = smla_torch.sparse_decode(q, cache, idx, **kwargs)
    retyped = smla.KvCache(cache.pages.view(dtype), "v4-fp8")
    out, lse = smla_torch.sparse_decode(q, retyped, idx, **kwargs)
    assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
    inferred, _ = smla_torch.sparse_decode(q, cache.pages.view(dtype), idx, **kwargs)  # format from the row size
    assert torch.equal(inferred, base_out)


def test_torch_token_order_is_ignored_on_the_host(rng):
    case = decode_case(rng, tokens=6)
    q, cache, idx, kwargs = to_torch(case["q"]), to_torch(case["main_cache"]), to_torch(case["main_indices"]), \
        torch_kwargs(case)
    base_out, base_lse = smla_torch.sparse_decode(q, cache, idx, **kwargs)
    order = torch.full((6,), -1, dtype=torch.int32)
    for decode in (smla_torch.sparse_decode, smla.sparse_decode):  # the generic API hands torch tensors over
        for ready in (False, True):
            out, lse = decode(q, cache, idx, token_order=order, token_order_ready=ready, **kwargs)
            assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
    assert torch.equal(order, torch.full((6,), -1, dtype=torch.int32))
    out, lse = smla_torch.sparse_decode(q, cache, idx, token_order=torch.randperm(6, dtype=torch.int32),
                                        token_order_ready=True, **kwargs)
    assert torch.equal(out, base_out) and torch.equal(lse, base_lse)


def test_torch_bad_token_order_names_it(rng):
    case = decode_case(rng, extra=False)
    q, cache, idx = to_torch(case["q"]), to_torch(case["main_cache"]), to_torch(case["main_indices"])
    T = q.shape[0]
    bad = {"dtype": torch.zeros(T, dtype=torch.int64), "shape": torch.zeros(T + 1, dtype=torch.int32),
           "strides": torch.zeros(2 * T, dtype=torch.int32)[::2]}
    for decode in (smla_torch.sparse_decode, smla.sparse_decode):
        for what, order in bad.items():
            with pytest.raises(smla.Error, match="token_order"):
                decode(q, cache, idx, token_order=order)
            with pytest.raises(smla.Error, match="token_order"):
                decode(q, cache, idx, token_order=order, token_order_ready=True)
        with pytest.raises(smla.Error, match="token_order"):
            decode(q, cache, idx, token_order_ready=True)


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs torch >= 2.4")
def test_registered_decode_op_mutates_token_order():
    schema = str(torch.ops.smla.sparse_decode.default._schema)
    assert "Tensor(a" in schema and "!)? token_order" in schema and "bool token_order_ready" in schema, schema
