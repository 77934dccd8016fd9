#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/ (committed; rerun to regenerate).

Small valid inputs of each format plus a few near misses; the binary targets
(step_metadata, index_transforms, attention) get fixed pseudo-random bytes.
Standard library only."""
import json
import os
import random
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(ROOT, target, name), mode) as f:
        f.write(data)


def npy(descr, shape, payload, version=1, fortran=False):
    shape_text = "(%s)" % ("%d," % shape[0] if len(shape) == 1 else ", ".join(str(s) for s in shape))
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shape_text)
    length_bytes = 2 if version == 1 else 4
    pad = (64 - (8 + length_bytes + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + payload


rng = random.Random(15)
write("npy", "f4_2x3.npy", npy("<f4", [2, 3], struct.pack("<6f", *[0.5 * i for i in range(6)])))
write("npy", "u2_4.npy", npy("<u2", [4], struct.pack("<4H", 0x3F80, 0x7FC0, 0xFF80, 0)))
write("npy", "i4_2x2x2.npy", npy("<i4", [2, 2, 2], struct.pack("<8i", -1, 0, 1, 2, 3, 4, 2**31 - 1, -2**31)))
write("npy", "u1_1x2x3x4.npy", npy("|u1", [1, 2, 3, 4], bytes(range(24))))
write("npy", "i8_scalar.npy", npy("<i8", [], struct.pack("<q", 7)))
write("npy", "f8_empty.npy", npy("<f8", [0, 5], b""))
write("npy", "v2_f4.npy", npy("<f4", [3], struct.pack("<3f", 1, 2, 3), version=2))
write("npy", "v3_i4.npy", npy("<i4", [1], struct.pack("<i", 5), version=3))
write("npy", "fortran.npy", npy("<f4", [1], b"\0" * 4, fortran=True))
write("npy", "short_data.npy", npy("<f4", [4], b"\0" * 8))

decode = {"op": "sparse_decode", "format": "v4-fp8", "softmax_scale": 0.04419417,
          "q": "q.npy", "main_cache": "main_cache.npy", "main_indices": "main_indices.npy"}
write("manifest", "decode_min.json", json.dumps(decode))
full = dict(decode, main_lengths="main_lengths.npy", extra_cache="extra_cache.npy",
            extra_indices="extra_indices.npy", extra_lengths="extra_lengths.npy", sink="sink.npy",
            main_page_stride_bytes=37440, extra_page_stride_bytes=1728, _comment="engine dump")
write("manifest", "decode_full.json", json.dumps(full, indent=2))
write("manifest", "fp8_rows.json", json.dumps(dict(decode, format="fp8-rows", fp8_scale=0.5)))
write("manifest", "prefill.json", json.dumps({"op": "sparse_prefill", "softmax_scale": 0.0417, "q": "q.npy",
                                                "kv": "kv.npy", "indices": "indices.npy",
                                                "topk_length": "topk_length.npy", "sink": "sink.npy", "d_v": 512}))
write("manifest", "bad_key.json", json.dumps(dict(decode, main_length="x.npy")))

write("plan_batch", "docs_example.json", json.dumps(
    {"config": {"window": 128, "max_model_len": 65536, "index_topk": 512, "num_speculative_tokens": 0},
     "num_tokens": -1, "token_valid": [1], "groups": ["c4", "c128"],
     "requests": [{"query_len": 1, "seq_len": 1000, "swa_block_table": [0, 1, 2]*6, "c4_block_table": [5]}]}))
write("plan_batch", "prefill.json", json.dumps(
    {"config": {"window": 128, "index_topk": 512},
     "requests": [{"query_len": 200, "seq_len": 500, "swa_block_table": [7, 6, 5, 4, 3, 2, 1, 0]}],
     "groups": ["c4"]}))
write("plan_batch", "mixed.json", json.dumps(
    {"config": {"window": 16, "max_model_len": 2048, "max_num_batched_tokens": 64, "index_topk": 32,
                "num_speculative_tokens": 1, "prefill_chunk_size": 2, "swa_page_size": 16,
                "logical_block_size": 256, "c128a_active_width": 0},
     "num_tokens": 24, "token_valid": [1, 1, 1, 0] + [1] * 16, "groups": ["c128"],
     "requests": [{"query_len": 2, "seq_len": 40}, {"query_len": 1, "seq_len": 9},
                  {"query_len": 17, "seq_len": 300}], "_note": "three requests"}))

for target in ("step_metadata", "index_transforms", "attention"):
    for size in (16, 64, 256, 1024, 4096, 16384):
        write(target, "random_%d" % size, bytes(rng.getrandbits(8) for _ in range(size)))
