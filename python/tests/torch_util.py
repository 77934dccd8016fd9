"""NumPy case arrays as torch tensors (bf16 from uint16 bit patterns)."""

import numpy as np
import torch

import smla
from reference import padded_pages


def to_torch(value, device="cpu"):
    if value is None:
        return None
    if isinstance(value, smla.KvCache):
        pages = value.pages
        flat = padded_pages(pages)
        strides = tuple(s // pages.itemsize for s in pages.strides)
        if pages.dtype == np.uint16:
            base = torch.from_numpy(flat.astype(np.int16)).view(torch.bfloat16).to(device)
        else:
            base = torch.from_numpy(flat.copy()).to(device)
        return smla.KvCache(base.as_strided(pages.shape, strides), value.format, value.fp8_scale)
    if value.dtype == np.uint16:
        return torch.from_numpy(value.astype(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(value)).to(device)


def bf16_to_numpy_bits(tensor):
    return tensor.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def assert_permutation(order):
    """order (a torch tensor) holds every value of range(order.numel()) once."""
    assert sorted(order.cpu().tolist()) == list(range(order.numel())), "token_order: not a permutation of range(T)"
