#!/usr/bin/env python3
"""Writes one side-by-side run as bench/results/<date>-<card>-<commit>.json.

Inputs are the two tools' outputs from ONE device call on one GPU: smla's
`smla_bench_cuda --json FILE` and the peer's `flashmla_peer.csv` (../shared/peer/run.sh).
Each smla case is matched with the FlashMLA case that serves the same step:
  CONFIGn -> MODEL1_CONFIGn, SQ1-CONFIGn -> MODEL1_CONFIGn_SQ1, V3.2 -> V32,
  TP-hN -> TP_PAD64 (FlashMLA must pad a TP shard to 64 heads), same b;
  prefill PF-/PFD-V4-h64 -> PF_MODEL1_C1_h64_k512, PF-/PFD-V4-h128 -> PF_MODEL1_C2_h128_k1024,
  PF-/PFD-V32-h128 -> PF_V32_h128_k2048, PF-D512-hN -> PF_D512_hN_k2048, same s_kv (FlashMLA's bf16-workspace kernel alone).
  A direct V4 case attends its 128 window keys too (640 / 1152 keys a token): where the peer's CSV
  has a case of that many keys (PF_MODEL1_C1_h64_k640, PF_MODEL1_C2_h128_k1152: the harness copy
  with those two case lines added by bench/peer_same_keys.py, which scripts/gpu-check.sh runs) it is
  the match, else the k512 / k1024 one.
Cases without a peer counterpart (MTP packing) keep peer_us null.
Direct (PFD) cases also carry staging_us (smla's dequantize_and_gather of the bf16
workspace a two-pass user fills first) and peer_two_pass_us = staging_us + peer_us:
what a FlashMLA user pays for the same step from the FP8 caches. Prefill cases carry
the share of the measured bf16 GEMM ceiling (cuBLASLt, in smla's process) for both:
pct_gemm_ceiling and peer_pct_gemm_ceiling.

  bench/side_by_side.py --smla gpu_bench.json --peer flashmla_peer.csv --commit abc1234 [--out DIR]
"""

import argparse
import csv
import datetime
import json
import os
import re

DECODE_PEER = {"V3.2": "V32"}
PREFILL_PEER = {"V4-h64": "PF_MODEL1_C1_h64_k512", "V4-h128": "PF_MODEL1_C2_h128_k1024",
                "V32-h128": "PF_V32_h128_k2048", "D512-h64": "PF_D512_h64_k2048",
                "D512-h128": "PF_D512_h128_k2048"}
# Direct V4 cases: FlashMLA over as many keys a token (topk + the 128-key window), where the peer ran it.
PREFILL_PEER_SAME_KEYS = {"PFD-V4-h64": "PF_MODEL1_C1_h64_k640", "PFD-V4-h128": "PF_MODEL1_C2_h128_k1152"}


def decode_peer_case(label):
    if label in DECODE_PEER:
        return DECODE_PEER[label]
    if re.fullmatch(r"CONFIG\d", label):
        return "MODEL1_" + label
    match = re.fullmatch(r"SQ1-(CONFIG\d)", label)
    if match:
        return f"MODEL1_{match.group(1)}_SQ1"
    if re.fullmatch(r"TP-h\d+", label):
        return "TP_PAD64"
    return None


def prefill_peer_case(label):
    match = re.fullmatch(r"PFD?-(.+)", label)
    return PREFILL_PEER.get(match.group(1)) if match else None


def card_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def read_peer(path):
    """The peer's CSV rows by (kind, case, b, s_kv) (s_kv 0 for decode: its cases fix it)."""
    peer = {}
    for row in csv.DictReader(open(path)):
        key = (row["kind"], row["case"], int(row["b"]), int(row["s_kv"]) if row["kind"] == "prefill" else 0)
        peer[key] = row
    return peer


def side_by_side_cases(smla, peer):
    """One entry per smla case (`smla`: the benchmark's JSON), with its peer's figures where there is one."""
    ceiling = smla.get("bf16_gemm_ceiling_tflops")
    cases = []
    for r in smla.get("results", []):
        match = peer.get(("decode", decode_peer_case(r["label"]), int(r["b"]), 0))
        cases.append({"kind": "decode", "label": r["label"], "b": r["b"], "s_q": r["s_q"], "h_q": r["h_q"],
                      "s_kv": None, "smla_us": r["median_us"], "peer_us": float(match["median_us"]) if match else None,
                      "smla_tflops": r["tflops"], "peer_tflops": float(match["tflops"]) if match else None,
                      "peer_case": match["case"] if match else None})
    for r in smla.get("prefill", []):
        match = peer.get(("prefill", PREFILL_PEER_SAME_KEYS.get(r["label"]), 1, int(r["s_kv"])))
        if match is None:
            match = peer.get(("prefill", prefill_peer_case(r["label"]), 1, int(r["s_kv"])))
        peer_tflops = float(match["tflops"]) if match else None
        cases.append({"kind": "prefill", "label": r["label"], "b": 1, "s_q": r["s_q"], "h_q": r["h_q"],
                      "s_kv": r["s_kv"], "smla_us": r["median_us"],
                      "peer_us": float(match["median_us"]) if match else None, "smla_tflops": r["tflops"],
                      "peer_tflops": peer_tflops, "peer_case": match["case"] if match else None,
                      "mode": r.get("mode"), "pct_gemm_ceiling": r.get("pct_gemm_ceiling"),
                      "peer_pct_gemm_ceiling": 100.0 * peer_tflops / ceiling if peer_tflops and ceiling else None})
        staging = r.get("staging_us") or 0.0
        if r.get("mode") == "direct" and staging > 0 and match:
            cases[-1]["staging_us"] = staging
            cases[-1]["peer_two_pass_us"] = staging + float(match["median_us"])
    return cases


def result_document(smla, peer, commit, date):
    """The bench/results JSON of one run, and the file name it goes under."""
    card = smla.get("device", "unknown")
    doc = {"card": card, "commit": commit, "date": date,
           "bf16_gemm_ceiling_tflops": smla.get("bf16_gemm_ceiling_tflops"), "cases": side_by_side_cases(smla, peer)}
    return doc, f"{date}-{card_slug(card)}-{commit}.json"


def summary_line(c):
    ratio = f"{c['peer_us'] / c['smla_us']:.2f}x" if c["peer_us"] else "-"
    ceiling = ""
    if c.get("pct_gemm_ceiling") is not None:
        ceiling = f"  gemm ceiling {c['pct_gemm_ceiling']:.0f}%"
        if c.get("peer_pct_gemm_ceiling") is not None:
            ceiling += f" vs {c['peer_pct_gemm_ceiling']:.0f}%"
    two_pass = ""
    if c.get("peer_two_pass_us"):
        two_pass = (f"  two-pass {c['peer_two_pass_us']:9.1f} us (staging {c['staging_us']:.1f}) "
                    f"{c['peer_two_pass_us'] / c['smla_us']:.2f}x")
    return (f"{c['kind']:8s} {c['label']:13s} b={c['b']:<4} s_kv={c['s_kv'] or '':<7} smla {c['smla_us']:9.1f} us "
            f"peer {c['peer_us'] or float('nan'):9.1f} us  {ratio}{ceiling}{two_pass}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smla", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()

    doc, name = result_document(json.load(open(args.smla)), read_peer(args.peer), args.commit, args.date)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(path)
    for c in doc["cases"]:
        print(summary_line(c))


if __name__ == "__main__":
    main()
