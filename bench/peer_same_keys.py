#!/usr/bin/env python3
"""Adds two prefill cases to a copy of the peer harness (../shared/peer copied to .peer).

  bench/peer_same_keys.py .peer/harness/bench_flashmla.cu

smla's direct V4 prefill cases (PFD-V4-h64 / h128) attend the 128 window keys besides
the top-k, 640 / 1152 keys a token, while the peer's V4 prefill cases attend 512 / 1024.
This adds the same kernel and data generation at those key counts
(PF_MODEL1_C1_h64_k640, PF_MODEL1_C2_h128_k1152, s_kv 8K and 64K), which
bench/side_by_side.py then matches with the direct cases (docs/PERF.md, session 39).
Only the case list of the harness copy changes; the shared instrument stays as it is.
Idempotent; exit 1 (nothing written) where the harness's case list is not as expected.
"""
import sys

ANCHOR = '"PF_MODEL1_C2_h128_k1024", 4096, 128, 512, 1024, s});\n'
ADDED = ('    // smla: its direct V4 prefill cases attend the 128-key window too: the same kernel over as many keys.\n'
         '    for (int s : {8192, 65536}) v.push_back({"PF_MODEL1_C1_h64_k640", 4096, 64, 512, 640, s});\n'
         '    for (int s : {8192, 65536}) v.push_back({"PF_MODEL1_C2_h128_k1152", 4096, 128, 512, 1152, s});\n')


def main():
    path = sys.argv[1]
    text = open(path).read()
    if "PF_MODEL1_C1_h64_k640" in text:
        print(f"{path}: the same-keys cases are there already")
        return 0
    if text.count(ANCHOR) != 1:
        print(f"{path}: the V4 h128 prefill case line was not found once; harness left as it is")
        return 1
    with open(path, "w") as f:
        f.write(text.replace(ANCHOR, ANCHOR + ADDED))
    print(f"{path}: added PF_MODEL1_C1_h64_k640 and PF_MODEL1_C2_h128_k1152 (s_kv 8192, 65536)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
