"""Step metadata and index transforms (smla/metadata.h; docs/metadata.md).

Host arrays (NumPy or CPU torch) run through the host entries; CUDA tensors run
on the device (the Context forms of smla/metadata.h, in a cuda context) on
``stream`` and write every row up to their capacity, graph-safe. Outputs are caller-allocated, except in
``make_step_metadata``, which returns NumPy arrays sized for the step.
"""

from dataclasses import dataclass
from typing import Optional

from . import _C
from ._api import _stream_handle, cache_parts

StepConfig = _C.StepConfig
StepConfig.__doc__ = """Step-independent settings: window, max_model_len, max_num_batched_tokens,
index_topk, num_speculative_tokens, prefill_chunk_size, swa_page_size, logical_block_size,
c128a_active_width (see docs/metadata.md). validate() raises smla.Error naming a bad field."""


@dataclass
class Batch:
    """One step's batch, decode requests first (smla::BatchDescription).

    query_lens [R] int32, seq_lens [R] int32; num_tokens: T with trailing padding (-1: none);
    token_valid [T] uint8 or None; block tables [R, cols] int32 for the sliding-window group
    (64-token pages) and, when the model has them, the ratio-4 and ratio-128 groups.
    """

    query_lens: object
    seq_lens: object
    swa_block_table: object
    c4_block_table: Optional[object] = None
    c128_block_table: Optional[object] = None
    token_valid: Optional[object] = None
    num_tokens: int = -1


def describe_step(batch, config):
    """Validates the batch and returns its counts (num_reqs, num_decodes, ...) as a dict."""
    return dict(_C.describe_step(batch, config))


def make_step_metadata(batch, config):
    """Every per-step field as NumPy arrays (dict; "counts" holds the scalars)."""
    return dict(_C.make_step_metadata(batch, config))


def build_step_metadata(batch, config, buffers, *, counts=None, stream=None):
    """Builds the step fields into caller buffers (dict of StepMetadataBuffers field -> tensor).

    Host: returns the counts dict. CUDA (batch on the device): also needs ``counts``, an int64
    [12] device tensor (StepCounts fields then an error word), and returns None.
    """
    result = _C.build_step_metadata(batch, config, dict(buffers), counts, _stream_handle(stream))
    return None if result is None else dict(result)


def c4a_global_topk_indices(local_topk, token_to_req, is_valid_token, block_table, block_size, global_out, lens_out,
                            *, stream=None):
    """C4A local top-k -> global compressed slots, bounds-hardened and left-compacted (spec 4.2)."""
    _C.c4a_global_topk_indices(local_topk, token_to_req, is_valid_token, block_table, int(block_size), global_out,
                               lens_out, _stream_handle(stream))


def v32_request_to_global_indices(req_indices, req_id, block_table, block_size, out, *, block_stride_rows=0,
                                  valid_counts=None, stream=None):
    """V3.2 request-local token indices -> global cache slots (spec 4.7)."""
    _C.v32_request_to_global_indices(req_indices, req_id, block_table, int(block_size), int(block_stride_rows), out,
                                     valid_counts, _stream_handle(stream))


def mixed_sparse_indices(batch, config, compress_ratio, c4a_local_topk, out_indices, out_lens, *, stream=None):
    """FlashInfer TRTLLM-gen mixed rows: [window slots | compressed slots] (spec 4.6)."""
    _C.mixed_sparse_indices(batch, config, int(compress_ratio), c4a_local_topk, out_indices, out_lens,
                            _stream_handle(stream))


def prefill_chunk_plan(batch, config, compress_ratio, *, adaptive=False):
    """Chunks of the step's prefills (list of dicts: req/token ranges, compressed_rows, workspace_rows)."""
    return [dict(c) for c in _C.prefill_chunk_plan(batch, config, int(compress_ratio), bool(adaptive))]


def static_prefill_workspace(config, compress_ratio):
    """Upper-bound prefill workspace shape for any step (dict)."""
    return dict(_C.static_prefill_workspace(config, int(compress_ratio)))


def chunk_prefill_workspace(config, compress_ratio, chunk):
    """Exact prefill workspace shape of one chunk (dict)."""
    return dict(_C.chunk_prefill_workspace(config, int(compress_ratio), chunk))


def combine_topk_swa_indices(batch, config, compress_ratio, chunk, compressed_rows, workspace_rows, topk,
                             out_indices, out_lens, *, stream=None):
    """One chunk's token indices into its flattened bf16 workspace (spec 4.4)."""
    _C.combine_topk_swa_indices(batch, config, int(compress_ratio), chunk, int(compressed_rows), int(workspace_rows),
                                topk, out_indices, out_lens, _stream_handle(stream))


def dequantize_and_gather(cache, seq_lens, gather_lens, block_table, out, *, offset=0, stream=None):
    """Decodes each request's last gather_lens[b] rows into out[b, offset:] (bf16; spec 4.5)."""
    pages, code, scale = cache_parts(cache, "cache")
    _C.dequantize_and_gather(pages, code, scale, seq_lens, gather_lens, block_table, int(offset), out,
                             _stream_handle(stream))
