import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from reference import fresh_seed  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(fresh_seed())


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    import smla

    return torch.cuda.is_available() and "cuda" in smla.info()["available_backends"]


def orders_tokens():
    """Whether the CUDA device runs the Hopper kernel, whose decode plans past one wave of CTAs
    order their tokens (and write SparseDecodeArgs::token_order)."""
    import torch

    return torch.cuda.get_device_capability()[0] == 9
