"""smla: DeepSeek-V4 / V3.2 sparse MLA attention from Python.

The package is a thin layer over the C++ library (``smla._C``, pybind11 over
DLPack, no PyTorch dependency). Tensors may be ``torch.Tensor`` (CPU or CUDA),
NumPy arrays, or any object with ``__dlpack__`` (CuPy, JAX, ...). NumPy has no
bfloat16: pass bf16 data as ``uint16`` arrays of bit patterns (``to_bf16`` /
``from_bf16`` convert), or as ``ml_dtypes.bfloat16`` arrays.

Entry points:

* ``sparse_decode`` / ``sparse_prefill`` and their ``*_workspace_size`` queries;
* ``KvCache``, the KV formats and codecs (``quantize_into_cache``,
  ``gather_from_cache``, ``new_cache``, ``page_bytes``);
* step metadata and index transforms (``Batch``, ``StepConfig``,
  ``make_step_metadata`` and friends, in ``smla.metadata``);
* ``info()``;
* ``smla.torch`` (torch tensors, cached workspace, torch.library ops) and
  ``smla.flash_mla`` (FlashMLA's Python API, drop-in).

Every failed check raises ``smla.Error`` (a ``RuntimeError``) whose message
names the argument, the expected and the actual value. See docs/python.md.
"""

from . import _C
from ._api import (
    KvCache,
    sparse_decode,
    sparse_decode_workspace_size,
    sparse_prefill,
    sparse_prefill_workspace_size,
)
from ._formats import (
    KV_FORMATS,
    from_bf16,
    gather_from_cache,
    kv_format_info,
    new_cache,
    page_bytes,
    quantize_into_cache,
    to_bf16,
)
from .metadata import Batch, StepConfig

Error = _C.Error
__version__ = _C.version()
BACKENDS = ("auto", "reference", "cpu", "cuda")


def info():
    """Version, compiled and available backends, CUDA devices, and the KV formats.

    Returns a dict: ``version``, ``compiled_backends`` (built into this
    extension), ``available_backends`` (compiled and usable here: cuda needs a
    device), ``cuda_devices`` (index, name, compute capability, SMs, memory),
    ``torch_exchange_api`` (torch tensors read through DLPack's C exchange API, torch >= 2.10)
    and ``kv_formats`` (name -> kv_format_info).
    """
    return {
        "version": __version__,
        "compiled_backends": list(_C.compiled_backends()),
        "available_backends": list(_C.available_backends()),
        "cuda_devices": list(_C.cuda_devices()),
        "torch_exchange_api": bool(_C.torch_exchange_api()),
        "kv_formats": {name: kv_format_info(name) for name in KV_FORMATS},
    }


__all__ = [
    "BACKENDS", "Batch", "Error", "KV_FORMATS", "KvCache", "StepConfig", "from_bf16", "gather_from_cache", "info",
    "kv_format_info", "new_cache", "page_bytes", "quantize_into_cache", "sparse_decode",
    "sparse_decode_workspace_size", "sparse_prefill", "sparse_prefill_workspace_size", "to_bf16",
]
