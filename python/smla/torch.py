"""smla for PyTorch: torch tensors in and out, the current stream, a cached workspace.

``sparse_decode`` / ``sparse_prefill`` take the arguments of ``smla.sparse_decode`` /
``smla.sparse_prefill`` as torch tensors. CUDA tensors run on the current torch stream of
their device, with a workspace allocated once per device by ``torch.empty`` and grown when a
larger shape needs more; nothing synchronizes, so calls can be captured by
``torch.cuda.graph`` (make one eager call before capture so the workspace exists).

On torch >= 2.4 the ops are also registered through ``torch.library`` as
``torch.ops.smla.sparse_decode`` / ``torch.ops.smla.sparse_prefill`` (mutating ``out``, the
statistics and decode's ``token_order`` in place, with fake implementations), and
``torch.compile(fullgraph=True)`` traces the public functions into them. Eager calls skip the
dispatcher and call the extension directly. On older torch (Debian's 1.13) the plain calls work
the same.
"""

import torch

from . import _C
from ._api import VALUE_DIM, backend_code, cache_parts, default_scale

__all__ = ["sparse_decode", "sparse_prefill", "workspace_bytes"]

# decode_op(q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages,
# extra_format, extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse,
# queries_per_request, backend, token_order, token_order_ready) -> None: the registered op while
# torch.compile traces, else the direct call. smla.flash_mla calls it too.

# device index -> (tensor, address, bytes)
_workspaces = {}

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # one C call; the public route costs a few us more
except AttributeError:  # pragma: no cover - builds without it
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def workspace_bytes(device=None):
    """Bytes of the cached CUDA workspace of a device (0 when none was needed yet)."""
    index = torch.device(device).index if device is not None else torch.cuda.current_device()
    entry = _workspaces.get(index or 0)
    return 0 if entry is None else entry[2]


def _grow_workspace(index, needed):
    # 1 MiB granularity: a slightly larger batch does not reallocate again.
    size = (int(needed) + (1 << 20) - 1) >> 20 << 20
    tensor = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", index))
    entry = (tensor, tensor.data_ptr(), size)
    _workspaces[index] = entry
    return entry


_NO_WORKSPACE = (None, 0, 0)


def _call(entry, args, q, backend, tail=()):
    """Runs a _C entry; CUDA calls get the current stream and the cached workspace of q's device
    (the extension makes that device current for the call). `tail`: arguments after the stream."""
    if not q.is_cuda:
        entry(*args, backend, 0, 0, 0, *tail)
        return
    index = q.get_device()
    _, address, size = _workspaces.get(index, _NO_WORKSPACE)
    stream = _raw_stream(index)
    needed = entry(*args, backend, address, size, stream, *tail)
    if needed:  # nothing ran (token_order not written either): the retry is the call
        _, address, size = _grow_workspace(index, needed)
        entry(*args, backend, address, size, stream, *tail)


def _decode_impl(q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages, extra_format,
                 extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse, queries_per_request,
                 backend, token_order=None, token_order_ready=False):
    args = (q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages, extra_format,
            extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse, queries_per_request)
    _call(_C.sparse_decode, args, q, backend, (token_order, token_order_ready))


def _prefill_impl(q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse, backend):
    _call(_C.sparse_prefill, (q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse), q, backend)


_decode_op = _decode_impl
_prefill_op = _prefill_impl


def decode_op():
    return _decode_op if _is_compiling() else _decode_impl

if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    from typing import Optional

    from torch import Tensor

    # token_order is mutated (Tensor(a!)? in the schema): a call that is not ready writes it.
    @torch.library.custom_op("smla::sparse_decode", mutates_args=("out", "lse", "token_order"))
    def _decode_registered(q: Tensor, main_pages: Tensor, main_format: int, main_fp8_scale: float,
                           main_indices: Tensor, main_lengths: Optional[Tensor], extra_pages: Optional[Tensor],
                           extra_format: int, extra_fp8_scale: float, extra_indices: Optional[Tensor],
                           extra_lengths: Optional[Tensor], sink: Optional[Tensor], softmax_scale: float,
                           out: Tensor, lse: Tensor, queries_per_request: int, backend: int,
                           token_order: Optional[Tensor], token_order_ready: bool) -> None:
        _decode_impl(q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages,
                     extra_format, extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse,
                     queries_per_request, backend, token_order, token_order_ready)

    @_decode_registered.register_fake
    def _decode_fake(q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages,
                     extra_format, extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse,
                     queries_per_request, backend, token_order, token_order_ready):
        return None

    @torch.library.custom_op("smla::sparse_prefill", mutates_args=("out", "max_logits", "lse"))
    def _prefill_registered(q: Tensor, kv: Tensor, indices: Tensor, topk_length: Optional[Tensor],
                            sink: Optional[Tensor], softmax_scale: float, d_v: int, out: Tensor, max_logits: Tensor,
                            lse: Tensor, backend: int) -> None:
        _prefill_impl(q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse, backend)

    @_prefill_registered.register_fake
    def _prefill_fake(q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse, backend):
        return None

    _decode_op = _decode_registered
    _prefill_op = _prefill_registered


def sparse_decode(q, main_cache, main_indices, *, main_lengths=None, extra_cache=None, extra_indices=None,
                  extra_lengths=None, sink=None, softmax_scale=None, out=None, lse=None, queries_per_request=1,
                  backend="auto", token_order=None, token_order_ready=False):
    """smla.sparse_decode for torch tensors; returns (out, lse), allocating the ones not given.

    Runs on the current stream of q's device with the cached workspace (CUDA), or on the named host
    backend (CPU tensors). See smla.sparse_decode for the arguments and semantics.

    token_order: None or a [T] torch.int32 tensor on q's device, the step's token order: pass it
    with token_order_ready=False on the step's first call (which writes it when its plan orders
    tokens: the Hopper kernel past one wave of CTAs) and token_order_ready=True on the later calls
    of the step that share the lengths (which read it). Any permutation of range(T), or values
    outside it (-1), give the same results; a stale order is only slower.
    """
    main_pages, main_format, main_scale = cache_parts(main_cache, "main_cache")
    extra_pages, extra_format, extra_scale = cache_parts(extra_cache, "extra_cache")
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], VALUE_DIM), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    op = _decode_op if _is_compiling() else _decode_impl
    op(q, main_pages, main_format, main_scale, main_indices, main_lengths, extra_pages, extra_format, extra_scale,
       extra_indices, extra_lengths, sink, default_scale(q, softmax_scale), out, lse, int(queries_per_request),
       backend_code(backend), token_order, bool(token_order_ready))
    return out, lse


def sparse_prefill(q, kv, indices, *, topk_length=None, sink=None, softmax_scale=None, d_v=VALUE_DIM, out=None,
                   max_logits=None, lse=None, backend="auto"):
    """smla.sparse_prefill for torch tensors; returns (out, max_logits, lse)."""
    rows = (q.shape[0], q.shape[1])
    if out is None:
        out = torch.empty(rows + (int(d_v),), dtype=torch.bfloat16, device=q.device)
    if max_logits is None:
        max_logits = torch.empty(rows, dtype=torch.float32, device=q.device)
    if lse is None:
        lse = torch.empty(rows, dtype=torch.float32, device=q.device)
    op = _prefill_op if _is_compiling() else _prefill_impl
    op(q, kv, indices, topk_length, sink, default_scale(q, softmax_scale), int(d_v), out, max_logits, lse,
       backend_code(backend))
    return out, max_logits, lse
