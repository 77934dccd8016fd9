"""An independent float64 model of the KV formats and the attention contract, for the tests.

Written from docs/kv_formats.md and docs/attention.md, not from smla's code: the decoders read
raw page bytes, the attention loops over the candidates of each token.
"""

import os

import numpy as np


def fresh_seed():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return seed


def e4m3_to_f64(codes):
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 7).astype(np.float64)
    value = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    value = np.where((exponent == 15) & ((codes & 7) == 7), np.nan, value)
    return sign * value


def bf16_bytes_to_f64(raw):
    bits = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def bf16_bits_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def page_bytes_of(pages):
    """[num_pages, page stride] uint8 view of a NumPy byte cache (its padding included)."""
    stride = pages.strides[0]
    return np.lib.stride_tricks.as_strided(pages, (pages.shape[0], stride), (stride, 1))


def padded_pages(pages):
    """[num_pages, page stride in elements] view of a cache's pages, padding included: a copy of it
    carries the pages to another device with their page stride (pages.strides) intact."""
    stride = pages.strides[0] // pages.itemsize
    return np.lib.stride_tricks.as_strided(pages, (pages.shape[0], stride), (pages.strides[0], pages.itemsize))


def decode_rows(pages, fmt, slots, fp8_scale=1.0):
    """Rows [n, head_dim] float64 of the given slots (all must be valid)."""
    page_size = pages.shape[1]
    rows = []
    if fmt in ("bf16-rows", "fp8-rows"):
        for s in slots:
            row = pages[s // page_size, s % page_size]
            rows.append(bf16_bits_to_f64(row) if fmt == "bf16-rows" else e4m3_to_f64(row) * fp8_scale)
        return np.array(rows)
    raw = page_bytes_of(pages)
    for s in slots:
        page, t = raw[s // page_size], s % page_size
        if fmt == "v4-fp8":
            base = t * 576
            nope = e4m3_to_f64(page[base:base + 448])
            scales = 2.0 ** (page[page_size * 576 + t * 8: page_size * 576 + t * 8 + 7].astype(np.float64) - 127)
            nope = nope * np.repeat(scales, 64)
            rope = bf16_bytes_to_f64(page[base + 448: base + 576])
        else:
            base = t * 656
            nope = e4m3_to_f64(page[base:base + 512])
            scales = np.frombuffer(page[base + 512: base + 528].tobytes(), dtype=np.float32).astype(np.float64)
            nope = nope * np.repeat(scales, 128)
            rope = bf16_bytes_to_f64(page[base + 528: base + 656])
        rows.append(np.concatenate([nope, rope]))
    return np.array(rows)


def attend(q, sources, sink, scale, d_v=512):
    """q [T, h, d] float64; sources: list of (rows_fn, indices [T, k], lengths [T] or None, num_slots).

    Returns out [T, h, d_v] and lse [T, h] per docs/attention.md (empty: out 0, lse +inf).
    """
    tokens, heads, _ = q.shape
    out = np.zeros((tokens, heads, d_v))
    lse = np.full((tokens, heads), np.inf)
    for t in range(tokens):
        keys = []
        for rows_fn, indices, lengths, num_slots in sources:
            width = indices.shape[1] if lengths is None else max(0, min(int(lengths[t]), indices.shape[1]))
            chosen = [int(i) for i in indices[t, :width] if 0 <= i < num_slots]
            if chosen:
                keys.append(rows_fn(chosen))
        if not keys:
            continue
        k = np.concatenate(keys)  # [n, d]
        logits = scale * (q[t] @ k[:, :q.shape[2]].T)  # [h, n]
        m = logits.max(axis=1, keepdims=True)
        p = np.exp(logits - m)
        total = p.sum(axis=1)
        lse[t] = np.log(total) + m[:, 0]
        denominator = total + (np.exp(sink - m[:, 0]) if sink is not None else 0.0)
        out[t] = (p @ k[:, :d_v]) / denominator[:, None]
    return out, lse


def assert_close(actual_out, actual_lse, expected_out, expected_lse, out_tol=1e-2, lse_tol=1e-3):
    actual_out = np.asarray(actual_out, dtype=np.float64)
    assert np.array_equal(np.isnan(actual_out), np.isnan(expected_out)), "NaN positions differ"
    scale = max(1.0, float(np.abs(expected_out).max(initial=0.0)))
    error = np.abs(actual_out - expected_out).max(initial=0.0) / scale
    assert error < out_tol, f"out error {error}"
    actual_lse = np.asarray(actual_lse, dtype=np.float64)
    assert np.array_equal(np.isinf(actual_lse), np.isinf(expected_lse)), "inf positions of lse differ"
    finite = np.isfinite(expected_lse)
    if finite.any():
        lse_error = np.abs(actual_lse[finite] - expected_lse[finite]).max() / max(1.0, np.abs(expected_lse[finite]).max())
        assert lse_error < lse_tol, f"lse error {lse_error}"
