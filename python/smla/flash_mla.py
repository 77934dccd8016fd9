"""FlashMLA's Python API for the sparse paths, served by smla (drop-in).

    import smla.flash_mla as flash_mla

makes code written for ``flash_mla`` (deepseek-ai/FlashMLA, ``flash_mla_interface.py``) run
unchanged: ``get_mla_metadata``, ``flash_mla_with_kvcache`` (sparse: ``indices``,
``topk_length``, ``attn_sink``, ``extra_k_cache``, ``extra_indices_in_kvcache``,
``extra_topk_length``, ``is_fp8_kvcache``) and ``flash_mla_sparse_fwd`` take FlashMLA's
arguments in FlashMLA's order and return its layouts. Beyond FlashMLA: any head count
(1-128, no padding to 64), any CUDA GPU smla supports (sm80+), CPU tensors (the cpu backend),
bf16 caches with ``is_fp8_kvcache=False``, and ``out=`` to write the output in place.
Failed checks raise ``smla.Error`` (a ``RuntimeError``, as FlashMLA's ``TORCH_CHECK``).
"""

import dataclasses
from typing import Optional, Tuple

import torch

from . import _C
from . import torch as _smla_torch
from ._api import backend_code

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"]

_V4_HEAD_DIM, _V32_HEAD_DIM, _VALUE_DIM = 512, 576, 512
_ONE_BYTE = {torch.uint8, torch.int8}
if hasattr(torch, "float8_e4m3fn"):
    _ONE_BYTE.add(torch.float8_e4m3fn)
_AUTO = backend_code("auto")
_V4, _V32, _BF16_ROWS = (_C.kv_format_info(name)["code"] for name in ("v4-fp8", "v32-fp8", "bf16-rows"))


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler handle. smla plans inside each call, so it records the shapes of its
    first call and checks that later calls keep them (as FlashMLA requires). On CUDA it also holds
    the step's token order (SparseDecodeArgs::token_order): the first call writes it, later calls
    (the other layers, as with FlashMLA's scheduler metadata) read it."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None
    token_order: Optional[torch.Tensor] = None  # [b * s_q] int32 on q's device (CUDA calls)
    token_order_written: bool = False  # a call with this sched meta has run: later ones read the order


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """Returns (FlashMLASchedMeta(), None); arguments are accepted and ignored, as in FlashMLA."""
    return FlashMLASchedMeta(), None


def _fail(message):
    raise _C.Error(message)


def _check_sched_meta(sched_meta, key, device, make_config):
    """FlashMLA's rule: a FlashMLASchedMeta serves only calls with its first call's shapes, and
    (its token order lives there) on its first call's device."""
    if type(sched_meta) is not FlashMLASchedMeta:
        _fail(f"tile_scheduler_metadata: expected a FlashMLASchedMeta (from get_mla_metadata), got "
              f"{type(sched_meta).__name__}")
    seen = sched_meta.__dict__.get("_smla_key")
    if seen is None:
        sched_meta.have_initialized = True
        sched_meta.config = make_config()
        sched_meta._smla_key = key
        sched_meta._smla_device = device
    elif seen != key:
        _fail(f"tile_scheduler_metadata: expected the shapes of its first call {sched_meta.config}, got "
              f"{make_config()}; reuse a FlashMLASchedMeta only across calls with the same shapes")
    elif sched_meta._smla_device != device:
        _fail(f"tile_scheduler_metadata: expected q on the device of its first call, {sched_meta._smla_device}, "
              f"got {device}; each device needs its own FlashMLASchedMeta")


def _format_code(k_cache, name, is_fp8_kvcache, head_dim):
    one_byte = k_cache.dtype in _ONE_BYTE
    if is_fp8_kvcache != one_byte:
        _fail(f"{name}: expected {'a uint8, int8 or float8_e4m3fn' if is_fp8_kvcache else 'a bfloat16'} cache "
              f"with is_fp8_kvcache={is_fp8_kvcache}, got {k_cache.dtype}")
    if not one_byte:
        return _BF16_ROWS
    if head_dim == _V32_HEAD_DIM:
        return _V32
    if head_dim == _V4_HEAD_DIM:
        return _V4
    _fail(f"q: expected head_dim 512 (DeepSeek-V4) or 576 (V3.2) with an FP8 cache, got {head_dim}")


def _per_token(lengths, s_q):
    """FlashMLA's per-request [b] lengths -> smla's per-token [b * s_q]: one copy of a broadcast
    view (half the host time of repeat_interleave, which dominated this wrapper's own cost)."""
    if lengths is None or s_q == 1:
        return lengths
    return lengths.unsqueeze(1).expand(-1, s_q).reshape(-1)


def _token_order(sched_meta, q, tokens):
    """(buffer, ready) for a CUDA call: the first call with this sched meta gets a new buffer to
    write; every later one reads it. CPU calls: (None, False). The buffer starts as -1 (the launch
    order), so a later call whose plan orders tokens never reads garbage where the first call's
    route left it unwritten."""
    if not q.is_cuda:
        return None, False
    if sched_meta.token_order is None:
        sched_meta.token_order = torch.full((tokens,), -1, dtype=torch.int32, device=q.device)
    return sched_meta.token_order, sched_meta.token_order_written


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode with FlashMLA's signature.

    q: [b, s_q, h_q, d_qk] bf16 (d_qk 512: DeepSeek-V4 cache of 584-byte tokens; 576: V3.2,
    656 bytes). k_cache / extra_k_cache: [num_blocks, page_block_size, 1, bytes] uint8, int8 or
    float8_e4m3fn (padded page strides welcome), or bf16 [..., 1, 512] with is_fp8_kvcache=False.
    indices / extra_indices_in_kvcache: [b, s_q, topk] int32 global slots. topk_length /
    extra_topk_length: [b] int32. attn_sink: [h_q] float32. head_dim_v: 512. out: optional
    [b, s_q, h_q, 512] bf16 written in place.

    Returns (out [b, s_q, h_q, 512] bf16, softmax_lse [b, h_q, s_q] float32). Only the sparse
    path exists: indices=None (dense decode) raises smla.Error.
    """
    if num_splits is not None:
        _fail("num_splits: expected None (FlashMLA's placeholder), got a value")
    if indices is None:
        _fail("indices: dense decode (indices=None) is not implemented by smla; pass sparse indices")
    if causal:
        _fail("causal: expected False with sparse indices, got True")
    if head_dim_v != _VALUE_DIM:
        _fail(f"head_dim_v: expected 512, got {head_dim_v}")
    shape = q.shape
    if len(shape) != 4:
        _fail(f"q: expected [batch_size, seq_len_q, num_heads_q, head_dim], got shape {list(shape)}")
    if len(k_cache.shape) != 4:
        _fail(f"k_cache: expected [num_blocks, page_block_size, 1, head_dim], got shape {list(k_cache.shape)}")
    b, s_q, h_q, d_qk = shape
    topk = indices.shape[-1]
    has_extra = extra_k_cache is not None
    extra_topk = extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None
    extra_block = extra_k_cache.shape[1] if has_extra else None
    key = (shape, k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, topk, extra_block, extra_topk)
    _check_sched_meta(tile_scheduler_metadata, key, q.device, lambda: FlashMLASchedMeta.Config(
        b, s_q, h_q, k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, topk, extra_block, extra_topk))
    if not has_extra and (extra_indices_in_kvcache is not None or extra_topk_length is not None):
        _fail("extra_indices_in_kvcache / extra_topk_length: expected None without extra_k_cache")
    if has_extra and extra_indices_in_kvcache is None:
        _fail("extra_indices_in_kvcache: required with extra_k_cache")
    main_format = _format_code(k_cache, "k_cache", is_fp8_kvcache, d_qk)
    extra_format = _format_code(extra_k_cache, "extra_k_cache", is_fp8_kvcache, d_qk) if has_extra else -1
    if out is None:
        out = torch.empty((b, s_q, h_q, _VALUE_DIM), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device)
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    main_lengths, extra_lengths = _per_token(topk_length, s_q), _per_token(extra_topk_length, s_q)
    token_order, order_ready = _token_order(tile_scheduler_metadata, q, b * s_q)
    # The extension takes FlashMLA's [b, s_q, ...] views as they are (it merges b and s_q).
    args = [q, k_cache, main_format, 1.0, indices, main_lengths, extra_k_cache, extra_format, 1.0,
            extra_indices_in_kvcache, extra_lengths, attn_sink, scale, out, lse, s_q, _AUTO, token_order, order_ready]
    try:
        _smla_torch.decode_op()(*args)
    except _C.Error as error:
        if "merge without a copy" not in str(error) or "out:" in str(error):
            raise
        # q or indices views whose b and s_q strides do not merge: merge them by copying.
        args[0] = q.reshape(b * s_q, h_q, d_qk)
        args[4] = indices.reshape(b * s_q, topk)
        if has_extra:
            args[9] = extra_indices_in_kvcache.reshape(b * s_q, extra_topk)
        _smla_torch.decode_op()(*args)
    if token_order is not None:
        tile_scheduler_metadata.token_order_written = True  # only after a call that ran: later calls read it
    return out, lse.transpose(1, 2)


def _squeeze_kv_heads(tensor, name, rank):
    if tensor.dim() == rank + 1:
        if tensor.shape[1] != 1:
            _fail(f"{name}: expected h_kv == 1 (MQA), got {tensor.shape[1]}")
        return tensor[:, 0]
    if tensor.dim() != rank:
        _fail(f"{name}: expected {rank + 1} dimensions, got shape {list(tensor.shape)}")
    return tensor


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    indexer_topk: int = 0,
):
    """Sparse prefill with FlashMLA's signature.

    q: [s_q, h_q, d_qk] bf16; kv: [s_kv, h_kv=1, d_qk] bf16; indices: [s_q, h_kv=1, topk] int32
    (-1 or >= s_kv: not attended); attn_sink: [h_q] float32; topk_length: [s_q] int32;
    indexer_topk > 0 adds lse_indexer, the log-sum-exp over the first indexer_topk entries
    (any h_q here).

    Returns (output [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] float32, lse [s_q, h_q] float32)
    and lse_indexer when indexer_topk > 0.
    """
    kv_rows = _squeeze_kv_heads(kv, "kv", 2)
    index_rows = _squeeze_kv_heads(indices, "indices", 2)
    out, max_logits, lse = _smla_torch.sparse_prefill(q, kv_rows, index_rows, topk_length=topk_length,
                                                      sink=attn_sink, softmax_scale=sm_scale, d_v=d_v)
    if not indexer_topk:
        return out, max_logits, lse
    if indexer_topk < 0:
        _fail(f"indexer_topk: expected a value >= 0, got {indexer_topk}")
    width = min(int(indexer_topk), index_rows.shape[-1])
    lengths = topk_length.clamp(max=width) if topk_length is not None else None
    _, _, lse_indexer = _smla_torch.sparse_prefill(q, kv_rows, index_rows[:, :width], topk_length=lengths,
                                                   softmax_scale=sm_scale, d_v=d_v)
    return out, max_logits, lse, lse_indexer
