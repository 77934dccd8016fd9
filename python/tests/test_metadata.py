"""Step metadata and index transforms from Python, against hand-computed values (docs/metadata.md)."""

import numpy as np
import pytest

import smla
from smla import metadata


def small_config():
    config = smla.StepConfig()
    config.window = 4
    config.max_model_len = 1024
    config.max_num_batched_tokens = 64
    config.index_topk = 8
    config.swa_page_size = 64
    return config


def test_decode_and_prefill_request_by_hand():
    # request 0 decodes its 11th token; request 1 prefills 3 tokens on top of 2 cached ones.
    batch = smla.Batch(query_lens=np.array([1, 3], np.int32), seq_lens=np.array([11, 5], np.int32),
                       swa_block_table=np.array([[7], [2]], np.int32))
    md = metadata.make_step_metadata(batch, small_config())
    counts = md["counts"]
    assert (counts["num_decodes"], counts["num_prefills"], counts["num_tokens"]) == (1, 1, 4)
    assert md["query_start_loc"].tolist() == [0, 1, 4]
    assert md["positions"].tolist() == [10, 2, 3, 4]
    assert md["token_to_req"].tolist() == [0, 1, 1, 1]
    # slots = block * 64 + position; window rows are the last min(pos + 1, W) slots, oldest first.
    assert md["swa_slot_mapping"].tolist() == [7 * 64 + 10, 2 * 64 + 2, 2 * 64 + 3, 2 * 64 + 4]
    assert md["swa_indices"][0].tolist() == [7 * 64 + 7, 7 * 64 + 8, 7 * 64 + 9, 7 * 64 + 10]
    assert md["swa_indices"][1].tolist() == [128, 129, 130, -1]
    assert md["swa_lens"].tolist() == [4, 3, 4, 4]
    assert metadata.describe_step(batch, small_config())["max_seq_len"] == 11


def test_caller_buffers_match_the_owning_builder():
    batch = smla.Batch(query_lens=np.array([1, 1], np.int32), seq_lens=np.array([3, 70], np.int32),
                       swa_block_table=np.array([[1, 0], [4, 5]], np.int32))
    config = small_config()
    md = metadata.make_step_metadata(batch, config)
    buffers = {name: np.full_like(md[name], 0x5A) for name in md if name != "counts"}  # poisoned
    counts = metadata.build_step_metadata(batch, config, buffers)
    assert counts == md["counts"]
    for name, value in buffers.items():
        assert np.array_equal(value, md[name]), name


def test_metadata_errors_name_the_field():
    config = small_config()
    bad = smla.Batch(query_lens=np.array([2], np.int32), seq_lens=np.array([1], np.int32),
                     swa_block_table=np.array([[0]], np.int32))
    with pytest.raises(smla.Error, match="seq_lens"):
        metadata.make_step_metadata(bad, config)
    config.window = 0
    with pytest.raises(smla.Error, match="window"):
        config.validate()


def test_c4a_global_topk_indices_by_hand():
    # block size 4: local l -> table[req][l // 4] * 4 + l % 4; bad entries dropped and compacted.
    local = np.array([[0, 5, -1, 9], [3, 4, 100, 1]], np.int32)
    token_to_req = np.array([0, 1], np.int32)
    table = np.array([[2, 3, 0], [6, -1, 1]], np.int32)
    out = np.full((2, 4), 99, np.int32)
    lens = np.zeros(2, np.int32)
    metadata.c4a_global_topk_indices(local, token_to_req, None, table, 4, out, lens)
    assert out.tolist() == [[8, 13, 1, -1], [27, 25, -1, -1]]
    assert lens.tolist() == [3, 2]


def test_v32_request_to_global_indices_by_hand():
    req_indices = np.array([[0, 17, -1, 16]], np.int32)
    out = np.zeros((1, 4), np.int32)
    metadata.v32_request_to_global_indices(req_indices, np.array([0], np.int32), np.array([[5, 9]], np.int32), 16,
                                           out)
    assert out.tolist() == [[80, 145, -1, 144]]


def test_prefill_chunk_and_combined_indices_by_hand():
    # request 1 prefills positions 2..4 (seq_len 5, window 4): its workspace holds positions 0..4.
    batch = smla.Batch(query_lens=np.array([1, 3], np.int32), seq_lens=np.array([11, 5], np.int32),
                       swa_block_table=np.array([[7], [2]], np.int32))
    config = small_config()
    chunks = metadata.prefill_chunk_plan(batch, config, 1)
    assert chunks == [dict(req_begin=1, req_end=2, token_begin=1, token_end=4, compressed_rows=0, workspace_rows=5)]
    shape = metadata.chunk_prefill_workspace(config, 1, chunks[0])
    assert (shape["rows"], shape["index_rows"], shape["index_width"]) == (5, 3, 128)
    indices = np.full((3, 128), 77, np.int32)
    lens = np.zeros(3, np.int32)
    metadata.combine_topk_swa_indices(batch, config, 1, chunks[0], 0, 5, None, indices, lens)
    assert indices[:, :5].tolist() == [[0, 1, 2, -1, -1], [0, 1, 2, 3, -1], [1, 2, 3, 4, -1]]
    assert np.all(indices[:, 5:] == -1) and lens.tolist() == [3, 4, 4]


def test_dequantize_and_gather_reads_through_the_block_table(rng):
    cache = smla.new_cache("v4-fp8", 2, 4)
    smla.quantize_into_cache(cache, rng.standard_normal((8, 512)).astype(np.float32), np.arange(8, dtype=np.int32))
    out = np.full((1, 4, 512), 0x7FC0, np.uint16)
    # positions 3, 4, 5 of a request of 6 tokens whose pages are [1, 0]: slots 7, 0, 1.
    metadata.dequantize_and_gather(cache, np.array([6], np.int32), np.array([3], np.int32),
                                   np.array([[1, 0]], np.int32), out)
    expected = np.zeros((3, 512), np.uint16)
    smla.gather_from_cache(cache, np.array([7, 0, 1], np.int32), expected)
    assert np.array_equal(out[0, :3], expected)
    assert np.all(out[0, 3] == 0x7FC0)  # rows outside the gathered range are not touched
