"""Framework-neutral attention entry points (NumPy, DLPack producers); torch tensors go to smla.torch."""

import sys
from typing import NamedTuple, Optional

from . import _C

VALUE_DIM = 512  # d_v of every KV format (kv_format_info(...)["value_dim"])


class KvCache(NamedTuple):
    """A paged KV cache: ``pages`` with an explicit ``format``.

    pages: V4 / V3.2: bytes (uint8, int8 or float8_e4m3fn) ``[num_pages, page_size, bytes_per_token]``
    or FlashMLA's ``[num_blocks, block_size, 1, bytes_per_token]``, page stride taken from the tensor
    (padded pages welcome); bf16 rows ``[num_pages, page_size, 512]``; fp8 rows e4m3 ``[..., 512]``
    with the per-tensor ``fp8_scale``. format: "v4-fp8", "v32-fp8", "bf16-rows", "fp8-rows", or
    None to infer it from the dtype and row size (584 bytes: v4-fp8, 656: v32-fp8, 512 bytes:
    fp8-rows, 512 bf16: bf16-rows). A bare tensor passed as a cache means ``KvCache(tensor)``.
    """

    pages: object
    format: Optional[str] = None
    fp8_scale: float = 1.0


_FORMAT_CODES = {}
_BACKEND_CODES = {}


def _format_code(name):
    if name is None:
        return -1
    code = _FORMAT_CODES.get(name)
    if code is None:
        code = _C.kv_format_info(name)["code"]  # raises smla.Error naming the format
        _FORMAT_CODES[name] = code
    return code


def backend_code(name):
    code = _BACKEND_CODES.get(name)
    if code is None:
        if not isinstance(name, str):
            raise _C.Error(f"backend: expected one of auto, reference, cpu, cuda, got {name!r}")
        code = _C.backend_code(name)
        _BACKEND_CODES[name] = code
    return code


def cache_parts(cache, name):
    """(pages, format code, fp8_scale) of a KvCache, a bare tensor or None."""
    if cache is None:
        return None, -1, 1.0
    if isinstance(cache, KvCache):
        return cache.pages, _format_code(cache.format), float(cache.fp8_scale)
    if isinstance(cache, (tuple, list)):
        raise _C.Error(f"{name}: expected a tensor or smla.KvCache, got {type(cache).__name__}")
    return cache, -1, 1.0


def is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy():
    import numpy

    return numpy


def _is_numpy(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def default_scale(q, softmax_scale):
    return q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


def _alloc(like, name, shape, kind):
    """NumPy outputs for NumPy inputs; other array types must pass their outputs."""
    if not _is_numpy(like):
        raise _C.Error(f"{name}: required for inputs of type {type(like).__name__} (pass {name}=, or use smla.torch)")
    np = _numpy()
    return np.empty(shape, dtype=np.uint16 if kind == "bf16" else np.float32)


def _stream_handle(stream):
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise _C.Error(f"stream: expected an int (cudaStream_t) or a stream object, got {type(stream).__name__}")


def _workspace_handle(workspace):
    if workspace is None:
        return 0, 0
    return _C.raw_buffer(workspace, "workspace")[:2]


def _run(entry, args, workspace, stream, tail=()):
    address, size = _workspace_handle(workspace)
    needed = entry(*args, address, size, _stream_handle(stream), *tail)
    if needed:
        raise _C.Error(f"workspace: expected a CUDA buffer of at least {needed} bytes, got {size}")


def _decode_args(q, main_cache, main_indices, main_lengths, extra_cache, extra_indices, extra_lengths, sink,
                 softmax_scale, out, lse, queries_per_request):
    main_pages, main_format, main_scale = cache_parts(main_cache, "main_cache")
    extra_pages, extra_format, extra_scale = cache_parts(extra_cache, "extra_cache")
    return (q, main_pages, main_format, main_scale, main_indices, main_lengths, extra_pages, extra_format,
            extra_scale, extra_indices, extra_lengths, sink, default_scale(q, softmax_scale), out, lse,
            int(queries_per_request))


def sparse_decode(q, main_cache, main_indices, *, main_lengths=None, extra_cache=None, extra_indices=None,
                  extra_lengths=None, sink=None, softmax_scale=None, out=None, lse=None, queries_per_request=1,
                  backend="auto", workspace=None, stream=None, token_order=None, token_order_ready=False):
    """Sparse MLA decode (and paged prefill) over one or two paged KV caches.

    Per query token t and head h (docs/attention.md): the first ``lengths[t]`` entries of each
    index row are candidates; an entry is attended when 0 <= index < the cache's slots, and its
    row is read only then. ``out = sum_j exp(s_j) v_j / (exp(sink[h]) + sum_j exp(s_j))`` with
    ``s_j = softmax_scale * <q, k_j>``; ``lse = log(sum_j exp(s_j))`` (sink excluded). A row
    with nothing to attend gives out 0 and lse +inf.

    Args:
      q: [T, h_q, d_qk] bf16 (d_qk 512 for V4 and plain rows, 576 for V3.2).
      main_cache: KvCache or a cache tensor (the sliding-window cache, or the V3.2 cache).
      main_indices: [T, k_main] int32 global slots (page * page_size + offset).
      main_lengths: [T] int32 or None (= k_main for every token).
      extra_cache, extra_indices [T, k_extra] int32, extra_lengths [T] int32: the compressed
        source (same format, own page size); extra_indices is required with extra_cache.
      sink: [h_q] float32 or None (= -inf).
      softmax_scale: float > 0; None means d_qk ** -0.5.
      out: [T, h_q, 512] bf16 to write, or None to allocate (NumPy: uint16 bf16 bits).
      lse: [T, h_q] float32 to write, or None to allocate.
      queries_per_request: tokens per request (s_q, MTP): a performance hint that must divide T.
      backend: "auto" (where the data lives: cuda for CUDA tensors, else cpu), "reference"
        (float64), "cpu" or "cuda".
      workspace: CUDA only, a contiguous device buffer of at least
        ``sparse_decode_workspace_size(...)`` bytes (smla.torch manages it for torch tensors).
      stream: CUDA only, a cudaStream_t as int or a stream object; None is the legacy default stream.
      token_order: None, or a contiguous [T] int32 buffer on q's device holding the order in which
        the Hopper (sm90) kernel runs the tokens (longest first). The first call of a step passes
        token_order_ready=False and, when its plan orders tokens, writes the order into it; later
        calls of the step with the same lengths (other layers of the kind) pass
        token_order_ready=True and read it instead of computing it again. Results never depend on
        it: any permutation of range(T), or values outside it (e.g. all -1), give the same
        outputs; a stale order is only slower. Host backends, other GPUs and plans that do not
        order tokens ignore it.
      token_order_ready: True to read what an earlier call wrote into token_order (requires it).

    Returns:
      (out, lse). Raises smla.Error on any invalid argument, naming it.
    """
    if is_torch(q):
        from . import torch as smla_torch

        return smla_torch.sparse_decode(
            q, main_cache, main_indices, main_lengths=main_lengths, extra_cache=extra_cache,
            extra_indices=extra_indices, extra_lengths=extra_lengths, sink=sink, softmax_scale=softmax_scale,
            out=out, lse=lse, queries_per_request=queries_per_request, backend=backend, token_order=token_order,
            token_order_ready=token_order_ready)
    if out is None:
        out = _alloc(q, "out", _shape2(q) + (VALUE_DIM,), "bf16")
    if lse is None:
        lse = _alloc(q, "lse", _shape2(q), "f32")
    args = _decode_args(q, main_cache, main_indices, main_lengths, extra_cache, extra_indices, extra_lengths, sink,
                        softmax_scale, out, lse, queries_per_request) + (backend_code(backend),)
    _run(_C.sparse_decode, args, workspace, stream, (token_order, bool(token_order_ready)))
    return out, lse


def sparse_decode_workspace_size(q, main_cache, main_indices, *, main_lengths=None, extra_cache=None,
                                 extra_indices=None, extra_lengths=None, sink=None, softmax_scale=None, out,
                                 lse=None, queries_per_request=1, backend="auto", token_order=None,
                                 token_order_ready=False):
    """Bytes of CUDA workspace sparse_decode needs for these shapes (0 on host backends).

    Depends only on shapes and the device, never on index or length values (nor on token_order):
    size it once for the largest batch. Takes the arguments of sparse_decode (out is required: its
    shape is checked).
    """
    args = _decode_args(q, main_cache, main_indices, main_lengths, extra_cache, extra_indices, extra_lengths, sink,
                        softmax_scale, out, lse, queries_per_request) + (backend_code(backend),)
    return _C.sparse_decode_workspace_size(*args, token_order, bool(token_order_ready))


def _shape2(q):
    shape = getattr(q, "shape", None)
    if shape is None or len(shape) != 3:
        raise _C.Error(f"q: expected a tensor [T, h_q, d_qk], got {type(q).__name__}"
                       + ("" if shape is None else f" of shape {list(shape)}"))
    return (int(shape[0]), int(shape[1]))


def sparse_prefill(q, kv, indices, *, topk_length=None, sink=None, softmax_scale=None, d_v=VALUE_DIM, out=None,
                   max_logits=None, lse=None, backend="auto", workspace=None, stream=None):
    """Sparse MLA prefill over a flat bf16 KV workspace (FlashMLA's sparse prefill contract).

    Args:
      q: [s_q, h_q, d_qk] bf16. kv: [s_kv, d_qk] bf16 (value = first d_v dims).
      indices: [s_q, topk] int32; -1 or >= s_kv is not attended.
      topk_length: [s_q] int32 or None (= topk). sink: [h_q] float32 or None.
      softmax_scale: float > 0, None means d_qk ** -0.5. d_v: 512.
      out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] f32 (-inf for empty rows), lse [s_q, h_q] f32
        (+inf for empty rows): written in place, or allocated when None.
      backend, workspace, stream: as sparse_decode.

    Returns:
      (out, max_logits, lse).
    """
    if is_torch(q):
        from . import torch as smla_torch

        return smla_torch.sparse_prefill(q, kv, indices, topk_length=topk_length, sink=sink,
                                         softmax_scale=softmax_scale, d_v=d_v, out=out, max_logits=max_logits,
                                         lse=lse, backend=backend)
    if out is None:
        out = _alloc(q, "out", _shape2(q) + (int(d_v),), "bf16")
    if max_logits is None:
        max_logits = _alloc(q, "max_logits", _shape2(q), "f32")
    if lse is None:
        lse = _alloc(q, "lse", _shape2(q), "f32")
    args = (q, kv, indices, topk_length, sink, default_scale(q, softmax_scale), int(d_v), out, max_logits, lse,
            backend_code(backend))
    _run(_C.sparse_prefill, args, workspace, stream)
    return out, max_logits, lse


def sparse_prefill_workspace_size(q, kv, indices, *, topk_length=None, sink=None, softmax_scale=None, d_v=VALUE_DIM,
                                  out, max_logits=None, lse=None, backend="auto"):
    """Bytes of CUDA workspace sparse_prefill needs for these shapes (0 on host backends)."""
    return _C.sparse_prefill_workspace_size(q, kv, indices, topk_length, sink, default_scale(q, softmax_scale),
                                            int(d_v), out, max_logits, lse, backend_code(backend))
