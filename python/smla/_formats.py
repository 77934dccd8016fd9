"""KV formats and codecs: the C++ traits (smla/kv_format.h) and codecs (smla/codec.h), byte for byte."""


from . import _C
from ._api import KvCache, cache_parts

KV_FORMATS = tuple(_C.kv_formats())  # in the C++ enum order (the codes _C takes)
# Byte-row formats by row length, for pages handed over without a format name.
_BYTE_ROW_FORMATS = {info["row_elements"]: name for name, info in
                     ((name, dict(_C.kv_format_info(name))) for name in KV_FORMATS) if info["storage_dtype"] == "u8"}


def kv_format_info(name):
    """dict(name, code, head_dim, value_dim, bytes_per_token, storage_dtype, row_elements) of a format."""
    return dict(_C.kv_format_info(name))


def page_bytes(name, page_size):
    """Bytes of one production page (V4: content padded to a multiple of 576 bytes)."""
    return int(_C.page_bytes(name, int(page_size)))


def new_cache(format, num_pages, page_size, *, device=None):
    """A zeroed KvCache with production page strides.

    device None gives NumPy pages; a torch device ("cpu", "cuda", "cuda:1", torch.device) gives
    torch pages. Pages are a strided view [num_pages, page_size, row] over num_pages * page_bytes
    bytes, so V4 pages carry their alignment padding, as engines allocate them.
    """
    info = kv_format_info(format)
    row = info["row_elements"]
    if info["storage_dtype"] == "bf16":
        element, page_elements = 2, page_bytes(format, page_size) // 2
    else:
        element, page_elements = 1, page_bytes(format, page_size)
    shape = (int(num_pages), int(page_size), row)
    if device is None:
        import numpy as np

        dtype = {"bf16": np.uint16, "e4m3": np.uint8, "u8": np.uint8}[info["storage_dtype"]]
        flat = np.zeros((int(num_pages), page_elements), dtype=dtype)
        pages = np.lib.stride_tricks.as_strided(flat, shape, (page_elements * element, row * element, element))
    else:
        import torch

        dtype = {"bf16": torch.bfloat16, "u8": torch.uint8}.get(info["storage_dtype"])
        if dtype is None:
            dtype = getattr(torch, "float8_e4m3fn", torch.uint8)
        flat = torch.zeros((int(num_pages), page_elements), dtype=dtype, device=device)
        pages = flat.as_strided(shape, (page_elements, row, 1))
    return KvCache(pages, format)


def quantize_into_cache(cache, rows, slots):
    """Writes rows [n, head_dim] (bf16 or f32, f32 rounded to bf16 first) into cache slots [n] (i32/i64).

    Slot -1 is skipped; any other slot outside the cache is an error and nothing is written.
    Byte-exact with the production quantization rule (docs/kv_formats.md). Host memory.
    """
    pages, code, scale = cache_parts(cache, "cache")
    _C.quantize_into_cache(pages, code, scale, rows, slots)


def gather_from_cache(cache, slots, out=None):
    """Reads slots [n] into out [n, head_dim] (bf16 or f32; allocated as NumPy f32 when None).

    Slot -1 yields a zero row; any other slot outside the cache is an error. Host memory.
    """
    pages, code, scale = cache_parts(cache, "cache")
    if out is None:
        import numpy as np

        head_dim = kv_format_info(_format_name(pages, code))["head_dim"]
        out = np.empty((len(slots), head_dim), dtype=np.float32)
    _C.gather_from_cache(pages, code, scale, slots, out)
    return out


def _format_name(pages, code):
    if code >= 0:
        return KV_FORMATS[code]
    row = pages.shape[-1]
    return _BYTE_ROW_FORMATS.get(row, "bf16-rows")


def to_bf16(values):
    """float32-convertible NumPy values -> uint16 bf16 bit patterns (round to nearest even, NaN kept)."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def from_bf16(bits):
    """uint16 bf16 bit patterns -> float32 NumPy values (exact)."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


