#!/usr/bin/env python3
"""Refits the sm90 plan's head-block cost (src/cuda/attention_plan.cc) from timings.

  head_block_fit.py --variant h64=64 --variant np64=64u --variant h32=32 --variant h16=16 [--weights 2.1,2.35,0.063] AB_LOG...

Each AB_LOG is a bench/cuda/ab_variants.sh log of decode cases whose variants force the
head-block size (SMLA_SM90_HEAD_ROWS; "64u": 64 with SMLA_SM90_PAIR=off), e.g. the runs
kept in bench/results/ab/. For every timing of an unpaired size it works out the plan's
split (as `split_for` in attention_plan.cc does: blocks = tokens x head blocks, splits
as many as one wave of `--slots` CTAs and the tiles allow); where the log has the plan
line the benchmark prints after each case (since 96bbdfb), the plan's own head blocks,
splits and CTA pairs are taken instead, and a case that differs from the recomputed split is
listed. Then it fits by least squares

  time = c0 + c1 x tiles a split + c2 x (live heads a block / 64) + c3 x (CTAs / slots) + c4 x splits

and prints the weights in tiles (c2 / c1, c3 / c1, c4 / c1: the plan's constants), the
fit's rms, and per case the fastest size against the one the weights pick. Paired 64
(h_q 65-128 without "u") is not fitted: the plan keeps pairs only for splits of
kPairMinTilesPerSplit tiles or more. Case shapes come from the case files (--cases).
No numpy: plain normal equations.
"""
import argparse
import collections
import json
import os
import re
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS_PER_TILE = 64
MAX_SPLITS = 64  # kMaxSplits
MAX_TILE_ROWS = 64


def load_shapes(paths):
    """(label, b) -> (tokens, h_q, tiles) of every decode case in the case files."""
    shapes = {}
    for path in paths:
        for case in json.load(open(path))["cases"]:
            keys = case["main_topk"] + case.get("extra_topk", 0)
            tiles = max((keys + KEYS_PER_TILE - 1) // KEYS_PER_TILE, 1)
            shapes[(case["label"], case["b"])] = (case["b"] * case["s_q"], case["h_q"], tiles)
    return shapes


def split_for(tokens, heads, rows, tiles, slots):
    """(CTAs, tiles a split, splits) of head blocks of `rows` heads."""
    blocks = max(tokens * ((heads + rows - 1) // rows), 1)
    most = max(1, min(slots // blocks, tiles, MAX_SPLITS))
    per_split = (tiles + most - 1) // most
    splits = (tiles + per_split - 1) // per_split
    return blocks * splits, per_split, splits


def features(tokens, heads, rows, tiles, slots, plan=None):
    ctas, per_split, splits = split_for(tokens, heads, rows, tiles, slots)
    if plan is not None:  # (head blocks, splits) the benchmark ran
        splits = plan[1]
        ctas, per_split = tokens * plan[0] * splits, (tiles + splits - 1) // splits
    return [1.0, per_split, min(rows, heads) / MAX_TILE_ROWS, ctas / slots, splits], splits


PLAN = re.compile(r"x (\d+) head blocks(?: of (\d+) heads)?, (\d+) splits")


def read_plan(line):
    """(head blocks, splits, CTA pairs, folded) of a benchmark plan line, or None."""
    match = PLAN.search(line)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(3)), "CTA pairs" in line, "merged in their cluster" in line


def solve(rows, values):
    """Least squares by the normal equations (Gaussian elimination with pivoting)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * v for r, v in zip(rows, values))]
         for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--variant", action="append", default=[], help="NAME=ROWS[u]: a variant's forced size")
    parser.add_argument("--cases", action="append",
                        default=[os.path.join(HERE, "..", "cases", f) for f in ("gpu.json", "gpu_small_batch.json")])
    parser.add_argument("--slots", type=int, default=132, help="CTAs of one wave (SMs x 1)")
    parser.add_argument("--weights", help="HEADS,CTAS,SPLITS: pick by these weights (e.g. the plan's) instead of the fit's")
    args = parser.parse_args()
    sizes = {}
    for spec in args.variant:
        name, rows = spec.split("=")
        sizes[name] = (int(rows.rstrip("u")), rows.endswith("u"))
    shapes = load_shapes(args.cases)

    times = collections.defaultdict(list)  # (log, label, b, variant) -> us
    plans = {}  # the same key -> read_plan of the plan line after its timing
    for log in args.logs:
        last = {}  # variant -> the key of its latest timing
        for line in open(log):
            f = line.split()
            if len(f) >= 6 and f[0] in sizes and f[2].isdigit() and (f[1], int(f[2])) in shapes:
                last[f[0]] = (log, f[1], int(f[2]), f[0])
                times[last[f[0]]].append(float(f[5]))
            elif len(f) >= 3 and f[1] == "plan" and f[0] in last:
                plan = read_plan(line)
                if plan is not None:
                    plans[last.pop(f[0])] = plan
    samples, cases = [], collections.defaultdict(dict)
    for key, values in times.items():
        log, label, b, name = key
        tokens, heads, tiles = shapes[(label, b)]
        rows, unpaired = sizes[name]
        plan = plans.get(key)
        paired = plan[2] if plan is not None else heads > MAX_TILE_ROWS and rows == MAX_TILE_ROWS and not unpaired
        if paired:
            continue  # CTA pairs
        if plan is not None and plan[1] != split_for(tokens, heads, rows, tiles, args.slots)[2]:
            print(f"{label} b={b} {name}: the plan ran {plan[0]} blocks x {plan[1]} splits, not the recomputed split")
        x, _ = features(tokens, heads, rows, tiles, args.slots, plan[:2] if plan is not None else None)
        samples.append((x, statistics.median(values)))
        cases[(log, label, b)][rows] = statistics.median(values)
    c = solve([x for x, _ in samples], [y for _, y in samples])
    rms = statistics.fmean((sum(a * b for a, b in zip(x, c)) - y) ** 2 for x, y in samples) ** 0.5
    print(f"{len(samples)} timings of {len(cases)} cases: time = {c[0]:.2f} + {c[1]:.2f} x tiles a split + "
          f"{c[2]:.2f} x heads / 64 + {c[3]:.2f} x CTAs / slots + {c[4]:.3f} x splits (us), rms {rms:.2f}")
    weights = [c[2] / c[1], c[3] / c[1], c[4] / c[1]]
    print("in tiles: heads %.2f, CTAs %.2f, splits %.3f" % tuple(weights))
    if args.weights:
        weights = [float(w) for w in args.weights.split(",")]
        print("picking by heads %.2f, CTAs %.2f, splits %.3f" % tuple(weights))
    picked_sum = best_sum = 0.0
    for (log, label, b), by_rows in sorted(cases.items()):
        tokens, heads, tiles = shapes[(label, b)]
        costs = {}
        for rows in by_rows:
            x, splits = features(tokens, heads, rows, tiles, args.slots)
            if splits > 1:
                costs[rows] = x[1] + weights[0] * x[2] + weights[1] * x[3] + weights[2] * x[4]
        if not costs:
            continue
        pick = min(costs, key=lambda r: (costs[r], -r))  # ties keep the larger blocks
        best = min(by_rows, key=by_rows.get)
        picked_sum += by_rows[pick]
        best_sum += by_rows[best]
        print(f"{os.path.basename(log):40} {label:15} b={b:<3} fastest {best:2} ({by_rows[best]:6.2f} us)"
              f"  picked {pick:2} ({by_rows[pick]:6.2f} us)")
    print(f"picked sizes: {picked_sum:.1f} us in all, fastest sizes {best_sum:.1f} us")


if __name__ == "__main__":
    main()
