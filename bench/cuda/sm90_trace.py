#!/usr/bin/env python3
"""Summarizes the phase timeline of the sm90 kernels (src/cuda/sm90/sm90_trace.cuh).

Reads the output of a benchmark built with -DSMLA_SM90_TRACE (lines "sm90trace ..." and "sm90waits ..."
from the FP8 rows kernel, "sm90items ..." from the copying kernel, "=== TITLE" lines between runs) and
prints, for the last launch of each titled run, the median time of every event from the CTA's
start (FP8 kernel) or the share of each phase in the even warpgroup's time and the time each
warpgroup waited at each hand-off of the loop over pairs (copying kernel).
  sm90_trace.py LOG [--clock-mhz 1980]
"""
import argparse
import statistics

EVENTS = ["barriers", "lengths", "first_keys", "tile0_stored", "last_stored", "query_staged", "tile0_full",
          "tiles_done", "output_written", "value_done", "end", "rows0_in", "scores0", "stats_published",
          "score_at_output", "value_at_output"]
LAUNCH_GAP_NS = 100_000  # CTAs of one launch start within this of each other


def parse(path):
    runs, title = {}, "untitled"
    for line in open(path, errors="replace"):
        if line.startswith("=== "):
            title = line[4:].strip()
            runs.setdefault(title, {"trace": [], "items": []})
            continue
        fields = line.split()
        if not fields:
            continue
        run = runs.setdefault(title, {"trace": [], "items": []})
        if fields[0] == "sm90trace":
            start = int(fields[8])
            deltas = [int(v) for v in fields[10:]]
            run["trace"].append((start, deltas, {}))
        elif fields[0] == "sm90waits" and run["trace"]:  # the waits of the CTA on the line before
            run["trace"][-1][2].update(zip(fields[5::2], (int(v) for v in fields[6::2])))
        elif fields[0] == "sm90items":
            run["items"].append(dict(zip(fields[1::2], (int(v) for v in fields[2::2]))))
    return runs


def last_launch(rows):
    rows = sorted(rows, key=lambda r: r[0])
    launch = [rows[0]]
    for row in rows[1:]:
        launch = launch + [row] if row[0] - launch[-1][0] <= LAUNCH_GAP_NS else [row]
    return launch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--clock-mhz", type=float, default=1980.0, help="SM clock under load (cycles -> us)")
    args = parser.parse_args()
    us = lambda cycles: cycles / args.clock_mhz
    for title, run in parse(args.log).items():
        if run["trace"]:
            launch = last_launch(run["trace"])
            print(f"{title}: FP8 kernel, {len(launch)} CTAs of the last launch, us from each CTA's start "
                  f"(median / min / max)")
            events = min(len(launch[0][1]), len(EVENTS))  # older logs stamp fewer events
            order = sorted(range(events), key=lambda e: statistics.median(d[e] for _, d, _ in launch))
            for e in order:
                values = [d[e] for _, d, _ in launch]
                print(f"  {EVENTS[e]:15} {us(statistics.median(values)):8.2f} {us(min(values)):8.2f} "
                      f"{us(max(values)):8.2f}")
            waits = launch[0][2].keys()
            if waits:
                # Thread 0 of each warpgroup: its cycles in each wait, summed over the CTA's tiles.
                print("  waits over the tiles, us a CTA (median / min / max):")
                for name in waits:
                    values = [w.get(name, 0) for _, _, w in launch]
                    print(f"    {name:15} {us(statistics.median(values)):8.2f} {us(min(values)):8.2f} "
                          f"{us(max(values)):8.2f}")
        if run["items"]:
            # One launch = as many lines as CTAs; the copying kernel's grid is at most one CTA per SM.
            rows = run["items"]
            ctas = len({r["cta"] for r in rows})
            launches = [rows[i:i + ctas] for i in range(0, len(rows), ctas)]
            for index, launch in enumerate(launches):
                keys = ("query", "first_tiles", "pairs", "output", "items", "producer_start", "indices_in",
                        "first_fill", "stats", "stores", "first_left", "third_fill")
                total = {k: sum(r.get(k, 0) for r in launch) for k in keys}
                begin = sum(r["start"] + r["output"] - r["last"] for r in launch if r["items"])
                spans = {
                    "query": total["query"] - begin,
                    "first_tiles": total["first_tiles"] - total["query"],
                    "pairs": total["pairs"] - total["first_tiles"],
                    "output": total["output"] - total["pairs"],
                }
                whole = sum(spans.values())
                print(f"{title}: copying kernel, launch {index}, {total['items']} items: " + ", ".join(
                    f"{name} {100 * value / whole:.1f}% ({us(value / total['items']):.2f} us/item)"
                    for name, value in spans.items()))
                if total["producer_start"]:
                    # Per-item averages of the finer stamps, against the even warpgroup's item start (its Q wait's start).
                    marks = {"producer start": total["producer_start"], "indices in": total["indices_in"],
                             "first copies issued": total["first_fill"], "Q in": total["query"],
                             "third fill issued": total["third_fill"], "first left half in": total["first_left"],
                             "first tiles in": total["first_tiles"], "pairs done": total["pairs"],
                             "stats published": total["stats"], "stores issued": total["stores"],
                             "output done": total["output"]}
                    marks = {name: value for name, value in marks.items() if value}  # older logs lack some stamps
                    print("    us from the item's start (the item before's output done): " + ", ".join(
                        f"{name} {us((value - begin) / total['items']):.2f}" for name, value in marks.items()))
                waits = {key[len("wait_"):]: sum(r.get(key, 0) for r in launch) for key in launch[0]
                         if key.startswith("wait_")}
                if any(waits.values()):
                    # Thread 0 of each warpgroup: its cycles in each wait of the loop, against the even warpgroup's pairs.
                    print("    waits in the loop, % of the pairs span (us/item): " + ", ".join(
                        f"{name} {100 * value / spans['pairs']:.1f}% ({us(value / total['items']):.2f})"
                        for name, value in waits.items() if value))


if __name__ == "__main__":
    main()
