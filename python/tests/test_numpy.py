"""smla from NumPy (and any DLPack producer) on the host backends, against the float64 model."""

import numpy as np
import pytest

import smla
from cases import HEAD_DIM, decode_case, decode_kwargs, prefill_case
from reference import assert_close, bf16_bits_to_f64, decode_rows, e4m3_to_f64

HOST_BACKENDS = ["reference", "cpu"]


class DLPackOnly:
    """Exposes an array through __dlpack__ alone (the path CuPy / JAX objects take)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("fmt", ["v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows"])
def test_decode_matches_float64_model(rng, backend, fmt):
    case = decode_case(rng, fmt=fmt, heads=int(rng.choice([1, 3, 8, 16])), page_size=int(rng.choice([1, 3, 5])))
    out, lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], backend=backend,
                                  **decode_kwargs(case))
    assert out.dtype == np.uint16 and lse.dtype == np.float32
    assert_close(bf16_bits_to_f64(out), lse, *case["expected"])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_decode_single_source_without_sink_or_lengths(rng, backend):
    case = decode_case(rng, extra=False, sink=False, lengths=False)
    out, lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], backend=backend,
                                  **decode_kwargs(case))
    assert_close(bf16_bits_to_f64(out), lse, *case["expected"])


def test_empty_rows_give_zero_and_plus_inf(rng):
    case = decode_case(rng, extra=False, tokens=2)
    indices = np.full_like(case["main_indices"], -1)
    out, lse = smla.sparse_decode(case["q"], case["main_cache"], indices, softmax_scale=0.1)
    assert np.all(out == 0) and np.all(np.isposinf(lse))


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_out_and_lse_written_in_place(rng, backend):
    case = decode_case(rng)
    tokens, heads = case["q"].shape[:2]
    out = np.full((tokens, heads, 512), 0x7FC0, dtype=np.uint16)  # poisoned with NaN
    lse = np.full((tokens, heads), np.nan, dtype=np.float32)
    got_out, got_lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], out=out, lse=lse,
                                          backend=backend, **decode_kwargs(case))
    assert got_out is out and got_lse is lse
    assert_close(bf16_bits_to_f64(out), lse, *case["expected"])


def test_strided_views_and_byte_offsets_give_the_same_bits(rng):
    case = decode_case(rng, heads=4)
    kwargs = decode_kwargs(case)
    base_out, base_lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], **kwargs)
    # q and indices inside larger buffers: non-contiguous strides and a non-zero start.
    wide_q = np.zeros((case["q"].shape[0], case["q"].shape[1] * 2 + 1, case["q"].shape[2]), dtype=np.uint16)
    wide_q[:, 1::2] = case["q"]
    k = case["main_indices"].shape[1]
    wide_idx = np.full((case["main_indices"].shape[0] + 1, k * 3), 5, dtype=np.int32)
    wide_idx[1:, 2:2 + k] = case["main_indices"]
    out = np.zeros((case["q"].shape[0], 2, case["q"].shape[1], 512), dtype=np.uint16)[:, 1]  # strided out
    lse = np.zeros((case["q"].shape[0], case["q"].shape[1] + 3), dtype=np.float32)[:, 3:]  # padded rows
    smla.sparse_decode(wide_q[:, 1::2], case["main_cache"], wide_idx[1:, 2:2 + k], out=out, lse=lse, **kwargs)
    assert np.array_equal(out, base_out) and np.array_equal(lse, base_lse)


def test_dlpack_producer_gives_the_same_bits(rng):
    case = decode_case(rng, extra=False)
    out, lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], **decode_kwargs(case))
    out2 = np.zeros_like(out)
    lse2 = np.zeros_like(lse)
    smla.sparse_decode(DLPackOnly(case["q"]), smla.KvCache(DLPackOnly(case["main_cache"].pages), "v4-fp8"),
                       DLPackOnly(case["main_indices"]), main_lengths=DLPackOnly(case["main_lengths"]),
                       sink=DLPackOnly(case["sink"]), softmax_scale=case["softmax_scale"], out=DLPackOnly(out2),
                       lse=DLPackOnly(lse2))
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)


def test_padded_page_stride(rng):
    """Pages inside a wider buffer: the page stride comes from the array, never recomputed."""
    case = decode_case(rng, fmt="v32-fp8", extra=False)
    pages = case["main_cache"].pages
    wide = np.full((pages.shape[0], pages.shape[1] * 656 + 100), 0x7F, dtype=np.uint8)
    wide[:, 40:40 + pages.shape[1] * 656] = pages.reshape(pages.shape[0], -1)
    padded = np.lib.stride_tricks.as_strided(wide[:, 40:], pages.shape, (wide.strides[0], 656, 1))
    out, lse = smla.sparse_decode(case["q"], smla.KvCache(padded, "v32-fp8"), case["main_indices"],
                                  **decode_kwargs(case))
    assert_close(bf16_bits_to_f64(out), lse, *case["expected"])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_prefill_matches_float64_model(rng, backend):
    case = prefill_case(rng, heads=int(rng.choice([1, 8, 16])))
    out, max_logits, lse = smla.sparse_prefill(case["q"], case["kv"], case["indices"],
                                               topk_length=case["topk_length"], sink=case["sink"],
                                               softmax_scale=case["softmax_scale"], backend=backend)
    assert_close(bf16_bits_to_f64(out), lse, *case["expected"])
    empty = np.isposinf(case["expected"][1])
    assert np.all(np.isneginf(max_logits[empty]))


def test_queries_per_request_does_not_change_results(rng):
    case = decode_case(rng, tokens=6)
    a = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], **decode_kwargs(case))
    b = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], queries_per_request=3,
                           **decode_kwargs(case))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_token_order_buffer_does_not_change_results(rng, backend):
    """Host backends ignore the step's token order: the results and the buffer are as they were."""
    case = decode_case(rng, tokens=6)
    args = (case["q"], case["main_cache"], case["main_indices"])
    base_out, base_lse = smla.sparse_decode(*args, backend=backend, **decode_kwargs(case))
    order = np.full(6, -1, np.int32)
    for ready in (False, True):
        out, lse = smla.sparse_decode(*args, backend=backend, token_order=order, token_order_ready=ready,
                                      **decode_kwargs(case))
        assert np.array_equal(out, base_out) and np.array_equal(lse, base_lse)
    assert np.all(order == -1)
    permuted = rng.permutation(6).astype(np.int32)
    permuted.flags.writeable = False  # a ready call only reads it
    out, lse = smla.sparse_decode(*args, backend=backend, token_order=permuted, token_order_ready=True,
                                  **decode_kwargs(case))
    assert np.array_equal(out, base_out) and np.array_equal(lse, base_lse)
    assert smla.sparse_decode_workspace_size(*args, out=out, token_order=order, token_order_ready=True,
                                             backend=backend, **decode_kwargs(case)) == 0


def test_extension_decode_entry_without_token_order_arguments(rng):
    """smla._C.sparse_decode's token order arguments are trailing and optional (callers that
    predate them, e.g. bench/python/host_overhead.py, pass everything else positionally)."""
    case = decode_case(rng, extra=False, tokens=3)
    base_out, base_lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"],
                                            **decode_kwargs(case))
    out, lse = np.empty_like(base_out), np.empty_like(base_lse)
    pages, fmt = case["main_cache"].pages, smla.kv_format_info("v4-fp8")["code"]
    args = (case["q"], pages, fmt, 1.0, case["main_indices"], case["main_lengths"], None, -1, 1.0, None, None,
            case["sink"], case["softmax_scale"], out, lse, 1, smla._api.backend_code("auto"))
    assert smla._C.sparse_decode(*args, 0, 0, 0) == 0
    assert np.array_equal(out, base_out) and np.array_equal(lse, base_lse)
    assert "token_order" in _error(smla._C.sparse_decode, *args, 0, 0, 0, None, True)

# ---------------------------------------------------------------------------------------------
# Errors: every bad input raises smla.Error naming the argument; nothing crashes.

def _error(fn, *args, **kwargs):
    with pytest.raises(smla.Error) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_bad_inputs_name_the_argument(rng):
    case = decode_case(rng, extra=False)
    q, cache, idx = case["q"], case["main_cache"], case["main_indices"]
    assert "q" in _error(smla.sparse_decode, q.astype(np.float32), cache, idx)
    assert "main_indices" in _error(smla.sparse_decode, q, cache, idx.astype(np.int64))
    assert "main_indices" in _error(smla.sparse_decode, q, cache, idx[0])
    assert "q" in _error(smla.sparse_decode, q[:, :, :100], cache, idx)
    assert "main_lengths" in _error(smla.sparse_decode, q, cache, idx, main_lengths=np.zeros(99, np.int32))
    assert "sink" in _error(smla.sparse_decode, q, cache, idx, sink=np.zeros(3, np.float64))
    assert "softmax_scale" in _error(smla.sparse_decode, q, cache, idx, softmax_scale=-1.0)
    assert "softmax_scale" in _error(smla.sparse_decode, q, cache, idx, softmax_scale=float("nan"))
    readonly = np.zeros((q.shape[0], q.shape[1], 512), np.uint16)
    readonly.flags.writeable = False
    assert "out" in _error(smla.sparse_decode, q, cache, idx, out=readonly)
    assert "out" in _error(smla.sparse_decode, q, cache, idx, out=np.zeros((1, 1, 512), np.uint16))
    assert "main_indices" in _error(smla.sparse_decode, q, cache, {"not": "a tensor"})
    assert "q" in _error(smla.sparse_decode, [[1, 2]], cache, idx)
    assert "backend" in _error(smla.sparse_decode, q, cache, idx, backend="tpu")
    assert "extra_indices" in _error(smla.sparse_decode, q, cache, idx, extra_cache=cache)
    assert "main_cache" in _error(smla.sparse_decode, q, np.zeros((2, 2, 100), np.uint8), idx)
    assert "main_cache" in _error(smla.sparse_decode, q, smla.KvCache(cache.pages, "v32-fp8"), idx)
    assert "v9" in _error(smla.sparse_decode, q, smla.KvCache(cache.pages, "v9"), idx)
    assert "queries_per_request" in _error(smla.sparse_decode, q, cache, idx, queries_per_request=0)
    assert "workspace" in _error(smla.sparse_decode, q, cache, idx, workspace=object())
    assert "stream" in _error(smla.sparse_decode, q, cache, idx, stream="default")


def test_bad_token_order_names_it(rng):
    case = decode_case(rng, extra=False)
    q, cache, idx = case["q"], case["main_cache"], case["main_indices"]
    T = q.shape[0]
    bad = {"dtype": np.zeros(T, np.int64), "shape": np.zeros(T + 1, np.int32), "rank": np.zeros((T, 1), np.int32),
           "strides": np.zeros(2 * T, np.int32)[::2]}
    for what, order in bad.items():
        for ready in (False, True):
            message = _error(smla.sparse_decode, q, cache, idx, token_order=order, token_order_ready=ready)
            assert "token_order" in message, (what, message)
    assert "token_order" in _error(smla.sparse_decode, q, cache, idx, token_order_ready=True)
    readonly = np.zeros(T, np.int32)
    readonly.flags.writeable = False  # a call that is not ready writes it
    assert "token_order" in _error(smla.sparse_decode, q, cache, idx, token_order=readonly)


def test_big_endian_and_misaligned_arrays_are_refused(rng):
    case = decode_case(rng, extra=False)
    assert "sink" in _error(smla.sparse_decode, case["q"], case["main_cache"], case["main_indices"],
                            sink=case["sink"].astype(">f4"))
    raw = np.zeros(case["q"].size * 2 + 1, np.uint8)[1:].view(np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.uint8), (case["q"].size,), (1,))
    assert _error(smla.sparse_decode, odd, case["main_cache"], case["main_indices"])  # rank 1 q


def test_prefill_bad_inputs(rng):
    case = prefill_case(rng)
    assert "kv" in _error(smla.sparse_prefill, case["q"], case["kv"][:, :100], case["indices"])
    assert "indices" in _error(smla.sparse_prefill, case["q"], case["kv"], case["indices"][:2])
    assert "d_v" in _error(smla.sparse_prefill, case["q"], case["kv"], case["indices"], d_v=1000)
    assert "topk_length" in _error(smla.sparse_prefill, case["q"], case["kv"], case["indices"],
                                   topk_length=np.zeros(2, np.int32))


# ---------------------------------------------------------------------------------------------
# Formats and codecs

def test_format_info_from_the_traits():
    assert smla.kv_format_info("v4-fp8")["bytes_per_token"] == 584
    assert smla.kv_format_info("v32-fp8")["bytes_per_token"] == 656
    assert smla.page_bytes("v4-fp8", 64) == 37440  # 64 * 584 = 37376, padded to a multiple of 576
    assert smla.page_bytes("v4-fp8", 2) == 1728
    assert "page_size" in _error(smla.page_bytes, "v4-fp8", 0)
    assert "v5" in _error(smla.kv_format_info, "v5")


@pytest.mark.parametrize("fmt", ["v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows"])
def test_codec_round_trip_against_the_byte_model(rng, fmt):
    cache = smla.new_cache(fmt, 3, 5)
    if fmt == "fp8-rows":
        cache = smla.KvCache(cache.pages, fmt, 0.25)
    n = 9
    rows = (rng.standard_normal((n, HEAD_DIM[fmt])) * 4).astype(np.float32)
    slots = rng.permutation(15)[:n].astype(np.int32)
    slots[0] = -1  # skipped
    smla.quantize_into_cache(cache, rows, slots)
    decoded = smla.gather_from_cache(cache, slots)
    assert np.all(decoded[0] == 0)  # slot -1 reads as zeros
    model = decode_rows(cache.pages, fmt, [int(s) for s in slots[1:]], cache.fp8_scale)
    assert np.array_equal(decoded[1:].astype(np.float64), model)  # the decoder is exact
    bf16_rows = bf16_bits_to_f64(smla.to_bf16(rows[1:]))
    if fmt == "bf16-rows":
        assert np.array_equal(model, bf16_rows)
    else:  # e4m3: 3 mantissa bits, scaled per tile: relative error <= 2^-4 of the tile's amax
        tile = 64 if fmt == "v4-fp8" else (128 if fmt == "v32-fp8" else 512)
        nope = 448 if fmt == "v4-fp8" else 512
        for r in range(n - 1):
            for start in range(0, nope, tile):
                amax = np.abs(bf16_rows[r, start:start + tile]).max()
                assert np.abs(model[r, start:start + tile] - bf16_rows[r, start:start + tile]).max() <= amax / 16 + 1e-6
        assert np.array_equal(model[:, nope:], bf16_rows[:, nope:])  # RoPE dims stay bf16


def test_codec_rejects_bad_slots_and_writes_nothing(rng):
    cache = smla.new_cache("v4-fp8", 2, 2)
    before = cache.pages.copy()
    rows = rng.standard_normal((2, 512)).astype(np.float32)
    assert "slots" in _error(smla.quantize_into_cache, cache, rows, np.array([0, 4], np.int32))
    assert np.array_equal(cache.pages, before)
    readonly = cache.pages.copy()
    readonly.flags.writeable = False
    assert "cache" in _error(smla.quantize_into_cache, smla.KvCache(readonly, "v4-fp8"), rows,
                             np.array([0, 1], np.int32))


def test_e4m3_model_matches_known_codes():
    assert e4m3_to_f64([0x00, 0x38, 0x7E, 0xFE, 0x01])[[0, 1, 2, 3, 4]].tolist() == [0.0, 1.0, 448.0, -448.0,
                                                                                       2.0 ** -9]
    assert np.isnan(e4m3_to_f64([0x7F]))[0]


def test_bf16_helpers_round_to_nearest_even():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf], dtype=np.float32)
    bits = smla.to_bf16(values)
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert np.isnan(smla.from_bf16(smla.to_bf16(np.array([np.nan], np.float32))))[0]


def test_info_lists_backends_and_formats():
    info = smla.info()
    assert info["version"] == smla.__version__
    assert {"reference", "cpu"} <= set(info["available_backends"])
    assert set(info["kv_formats"]) == set(smla.KV_FORMATS)


# ---------------------------------------------------------------------------------------------
# Python and the C++ entry points: the same bits. The C++ side runs through `smla replay`
# (tools/smla), which CTest names in SMLA_CLI.

def _replay(tmp_path, manifest, arrays, backend):
    import json
    import os
    import subprocess

    cli = os.environ.get("SMLA_CLI")
    if not cli:
        pytest.skip("SMLA_CLI (the smla binary) is not set: run through CTest")
    for name, value in arrays.items():
        if value is not None:
            np.save(tmp_path / f"{name}.npy", np.ascontiguousarray(value))
            manifest[name] = f"{name}.npy"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    subprocess.run([cli, "replay", str(tmp_path), "--backend", backend], check=True, capture_output=True)
    return {name: np.load(tmp_path / f"{name}.npy") for name in ("out", "lse", "max_logits")
            if (tmp_path / f"{name}.npy").exists()}


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_decode_equals_the_cpp_entry_point_bitwise(rng, tmp_path, backend):
    case = decode_case(rng, fmt="v4-fp8", heads=8)
    out, lse = smla.sparse_decode(case["q"], case["main_cache"], case["main_indices"], backend=backend,
                                  **decode_kwargs(case))
    dense = lambda cache: np.ascontiguousarray(cache.pages)  # noqa: E731  (replay stores pages densely)
    cpp = _replay(tmp_path, {"op": "sparse_decode", "format": "v4-fp8", "softmax_scale": case["softmax_scale"]},
                  {"q": case["q"], "main_cache": dense(case["main_cache"]), "main_indices": case["main_indices"],
                   "main_lengths": case["main_lengths"], "extra_cache": dense(case["extra_cache"]),
                   "extra_indices": case["extra_indices"], "extra_lengths": case["extra_lengths"],
                   "sink": case["sink"]}, backend)
    assert np.array_equal(cpp["out"], out) and np.array_equal(cpp["lse"], lse, equal_nan=True)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_prefill_equals_the_cpp_entry_point_bitwise(rng, tmp_path, backend):
    case = prefill_case(rng)
    out, max_logits, lse = smla.sparse_prefill(case["q"], case["kv"], case["indices"],
                                               topk_length=case["topk_length"], sink=case["sink"],
                                               softmax_scale=case["softmax_scale"], backend=backend)
    cpp = _replay(tmp_path, {"op": "sparse_prefill", "softmax_scale": case["softmax_scale"]},
                  {"q": case["q"], "kv": case["kv"], "indices": case["indices"], "topk_length": case["topk_length"],
                   "sink": case["sink"]}, backend)
    assert np.array_equal(cpp["out"], out)
    assert np.array_equal(cpp["lse"], lse, equal_nan=True)
    assert np.array_equal(cpp["max_logits"], max_logits, equal_nan=True)
