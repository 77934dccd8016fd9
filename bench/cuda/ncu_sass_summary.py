#!/usr/bin/env python3
"""Summarises Nsight Compute's per-instruction warp-stall samples of one kernel.

Input: the SASS source page as CSV, as bench/cuda/ncu_compare.sh writes it
(`ncu -i REPORT --page source --csv --print-source sass`). Printed:
  - the share of each stall reason over all samples;
  - samples by how often an instruction ran ("Instructions Executed"): with a
    known grid this separates code run once per CTA from code run once per tile;
  - samples by code region, the regions split at EXIT instructions (in
    warp-specialised kernels each warpgroup's code ends in its own EXIT);
  - the instructions with the most samples, with the barrier wait a spinning
    branch belongs to;
  - with --regions: per region, its static and executed instruction counts, the
    warp instructions it issued by opcode, and its stall reasons, so two kernels'
    warpgroups can be set side by side (session 19 of docs/PERF.md);
  - with --blocks START END: instructions START..END as runs of equal execution
    count (hot loop, once per work item, never run) with their samples.
  bench/cuda/ncu_sass_summary.py smla.sass.csv [--top 30] [--regions] [--blocks 3200 7448]
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The first row names the kernel; the header follows.
    header_at = next(i for i, r in enumerate(rows) if SAMPLES in r)
    header = rows[header_at]
    return rows[header_at - 1] if header_at else [], header, rows[header_at + 1:]


def as_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--regions", action="store_true", help="per-region instruction and stall breakdown")
    parser.add_argument("--blocks", type=int, nargs=2, metavar=("START", "END"),
                        help="instructions START..END as runs of equal execution count")
    args = parser.parse_args()
    kernel, header, rows = load(args.csv)
    col = {name: i for i, name in enumerate(header)}
    if SAMPLES not in col or EXECUTED not in col:
        sys.exit(f"{args.csv}: no '{SAMPLES}' / '{EXECUTED}' columns (ncu --section SourceCounters)")
    stalls = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    samples = [as_int(r[col[SAMPLES]]) for r in rows]
    executed = [as_int(r[col[EXECUTED]]) for r in rows]
    total = sum(samples) or 1
    name = next((cell for cell in kernel if cell and cell != "Kernel Name"), "")
    if name:
        print(name[:160])
    print(f"{len(rows)} instructions, {total} samples")

    by_reason = {n: sum(as_int(r[col[n]]) for r in rows) for n in stalls}
    print("stall reasons: " + ", ".join(f"{n[6:]} {100 * v / total:.1f}%"
                                        for n, v in sorted(by_reason.items(), key=lambda kv: -kv[1]) if v))

    by_count = collections.Counter()
    for s, e in zip(samples, executed):
        by_count[e] += s
    print("samples by executions of the instruction:")
    for e, s in sorted(by_count.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  executed {e:>10}: {s:7d} ({100 * s / total:4.1f}%)")

    # Regions [first, last]: each ends at an EXIT (or the last instruction, printed as len(rows)).
    regions = []
    start = 0
    for i, r in enumerate(rows + [["", "EXIT"]]):
        if "EXIT" in r[1] or i == len(rows):
            regions.append((start, i))
            start = i + 1

    print("regions (split at EXIT):")
    for first, last in regions:
        region = sum(samples[first:last + 1])
        if region >= total / 100:
            print(f"  [{first:5d}, {last:5d}] {region:7d} ({100 * region / total:4.1f}%)")

    def opcode(i):
        words = rows[i][1].split()
        if not words:
            return ""
        word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        return word.split(".")[0]

    def reasons_of(indices):
        counts = {n[6:]: sum(as_int(rows[k][col[n]]) for k in indices) for n in stalls}
        return ", ".join(f"{n} {v}" for n, v in sorted(counts.items(), key=lambda kv: -kv[1])[:6] if v)

    if args.regions:
        print("regions in detail (warp instructions issued, by opcode, in millions):")
        for first, last in regions:
            span = range(first, min(last + 1, len(rows)))
            issued = collections.Counter()
            for k in span:
                issued[opcode(k)] += executed[k]
            run = sum(1 for k in span if executed[k])
            print(f"  [{first:5d}, {last:5d}] static {len(span)}, run {run}, issued {sum(issued.values()) / 1e6:.1f} M: "
                  + ", ".join(f"{o} {v / 1e6:.1f}" for o, v in issued.most_common(10)))
            print(f"      stalls: {reasons_of(span)}")

    if args.blocks:
        first, last = args.blocks
        print(f"instructions {first}..{last} as runs of equal execution count:")
        begin = first
        for i in range(first + 1, min(last, len(rows)) + 1):
            if i == min(last, len(rows)) or executed[i] != executed[begin]:
                span = range(begin, i)
                marks = collections.Counter(opcode(k) for k in span
                                            if opcode(k) in ("HGMMA", "SYNCS", "BAR", "MUFU", "LDGSTS", "STG", "STSM"))
                print(f"  [{begin:5d}, {i:5d}) x{executed[begin]:<8d} {len(span):4d} instructions, "
                      f"{sum(samples[k] for k in span):6d} samples {dict(marks)}")
                begin = i

    print(f"top {args.top} instructions:")
    for i in sorted(sorted(range(len(rows)), key=lambda k: -samples[k])[:args.top]):
        reasons = sorted(((as_int(rows[i][col[n]]), n[6:]) for n in stalls), reverse=True)[:2]
        waits_on = ""
        if "BRA" in rows[i][1]:  # a try-wait loop's branch: name the wait it spins on
            for j in range(i - 1, max(i - 4, -1), -1):
                if "TRYWAIT" in rows[j][1] or "BAR" in rows[j][1]:
                    waits_on = "  <- " + rows[j][1].strip()[:48]
                    break
        print(f"  {i:5d} {samples[i]:6d} {100 * samples[i] / total:4.1f}% x{executed[i]:<8d} "
              f"{rows[i][1].strip()[:56]:56s} {' '.join(f'{n}:{v}' for v, n in reasons if v)}{waits_on}")


if __name__ == "__main__":
    main()
