"""Random decode / prefill cases built through the public API, with their float64 expectations."""

import numpy as np

import smla
from reference import attend, bf16_bits_to_f64, decode_rows, page_bytes_of

HEAD_DIM = {"v4-fp8": 512, "v32-fp8": 576, "bf16-rows": 512, "fp8-rows": 512}


def _fill_cache(rng, fmt, num_pages, page_size, selected, fp8_scale=1.0):
    """A cache with every selected slot quantized from random rows and NaN everywhere else."""
    cache = smla.new_cache(fmt, num_pages, page_size)
    cache = smla.KvCache(cache.pages, fmt, fp8_scale)
    num_slots = num_pages * page_size
    rows = (rng.standard_normal((num_slots, HEAD_DIM[fmt])) * rng.uniform(0.5, 3.0)).astype(np.float32)
    smla.quantize_into_cache(cache, rows, np.arange(num_slots, dtype=np.int64))
    unselected = np.setdiff1d(np.arange(num_slots), np.array(sorted(selected), dtype=np.int64))
    pages = cache.pages
    for s in unselected:  # NaN planted in every row the kernels must not read
        page, t = s // page_size, s % page_size
        if fmt == "bf16-rows":
            pages[page, t, :] = 0x7FC0
        elif fmt == "fp8-rows":
            pages[page, t, :] = 0x7F
        else:
            raw = page_bytes_of(pages)
            base = t * (576 if fmt == "v4-fp8" else 656)
            raw[page, base:base + (448 if fmt == "v4-fp8" else 512)] = 0x7F
    return cache


def _indices(rng, tokens, width, num_slots):
    idx = rng.integers(0, num_slots, size=(tokens, width)).astype(np.int32)
    idx[rng.random((tokens, width)) < 0.1] = -1
    idx[rng.random((tokens, width)) < 0.05] = num_slots + 7  # out of range: never read
    return idx


def _lengths(rng, tokens, width, group):
    return np.repeat(rng.integers(0, width + 1, size=tokens // group), group).astype(np.int32)


def _attended(indices, lengths, num_slots):
    chosen = set()
    for t in range(indices.shape[0]):
        width = indices.shape[1] if lengths is None else max(0, min(int(lengths[t]), indices.shape[1]))
        chosen.update(int(i) for i in indices[t, :width] if 0 <= i < num_slots)
    return chosen


def decode_case(rng, fmt="v4-fp8", tokens=5, heads=8, page_size=3, num_pages=6, k_main=7, extra=True,
                extra_page_size=2, extra_pages=5, k_extra=6, sink=True, lengths=True, length_group=1):
    """length_group > 1: one length per group of consecutive tokens (FlashMLA's per-request lengths)."""
    main_slots = num_pages * page_size
    main_indices = _indices(rng, tokens, k_main, main_slots)
    main_lengths = _lengths(rng, tokens, k_main, length_group) if lengths else None
    case = {"fmt": fmt}
    case["main_cache"] = _fill_cache(rng, fmt, num_pages, page_size, _attended(main_indices, main_lengths, main_slots))
    case["main_indices"], case["main_lengths"] = main_indices, main_lengths
    sources = [(lambda s, c=case["main_cache"]: decode_rows(c.pages, fmt, s), main_indices, main_lengths, main_slots)]
    case["extra_cache"] = case["extra_indices"] = case["extra_lengths"] = None
    if extra:
        extra_slots = extra_pages * extra_page_size
        extra_indices = _indices(rng, tokens, k_extra, extra_slots)
        extra_lengths = _lengths(rng, tokens, k_extra, length_group) if lengths else None
        case["extra_cache"] = _fill_cache(rng, fmt, extra_pages, extra_page_size,
                                          _attended(extra_indices, extra_lengths, extra_slots))
        case["extra_indices"], case["extra_lengths"] = extra_indices, extra_lengths
        sources.append((lambda s, c=case["extra_cache"]: decode_rows(c.pages, fmt, s), extra_indices, extra_lengths,
                        extra_slots))
    case["q"] = smla.to_bf16(rng.standard_normal((tokens, heads, HEAD_DIM[fmt])))
    case["sink"] = None
    if sink:
        sink_values = rng.standard_normal(heads).astype(np.float32)
        sink_values[0] = -np.inf
        case["sink"] = sink_values
    case["softmax_scale"] = float(HEAD_DIM[fmt] ** -0.5)
    case["expected"] = attend(bf16_bits_to_f64(case["q"]), sources, case["sink"], case["softmax_scale"])
    return case


def decode_kwargs(case):
    return dict(main_lengths=case["main_lengths"], extra_cache=case["extra_cache"],
                extra_indices=case["extra_indices"], extra_lengths=case["extra_lengths"], sink=case["sink"],
                softmax_scale=case["softmax_scale"])


def prefill_case(rng, s_q=6, heads=8, s_kv=20, topk=9, d_qk=512, lengths=True, sink=True):
    kv_values = rng.standard_normal((s_kv, d_qk)).astype(np.float32)
    kv = smla.to_bf16(kv_values)
    indices = _indices(rng, s_q, topk, s_kv)
    topk_length = rng.integers(0, topk + 1, size=s_q).astype(np.int32) if lengths else None
    q = smla.to_bf16(rng.standard_normal((s_q, heads, d_qk)))
    sink_values = rng.standard_normal(heads).astype(np.float32) if sink else None
    scale = float(d_qk ** -0.5)
    kv64 = bf16_bits_to_f64(kv)
    expected = attend(bf16_bits_to_f64(q), [(lambda s: kv64[s], indices, topk_length, s_kv)], sink_values, scale)
    return dict(q=q, kv=kv, indices=indices, topk_length=topk_length, sink=sink_values, softmax_scale=scale,
                expected=expected)


def step_order_case(rng, b=80, s_q=2, heads=64):
    """A DeepSeek-V4 decode step of b * s_q tokens x 64 heads with random per-request lengths: more
    CTAs than one wave of an H100/H200, so the Hopper kernel's plan orders its tokens
    (SparseDecodeArgs::token_order)."""
    return decode_case(rng, fmt="v4-fp8", tokens=b * s_q, heads=heads, page_size=64, num_pages=8, k_main=128,
                       extra_page_size=64, extra_pages=16, k_extra=192, length_group=s_q)
