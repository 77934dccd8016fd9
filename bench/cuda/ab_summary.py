#!/usr/bin/env python3
"""Medians of an ab.log (bench/cuda/ab_variants.sh) per case and variant, against "current".

  ab_summary.py AB_LOG
Each line of the log is "VARIANT LABEL ..." as the benchmark prints it: decode rows
"LABEL b s_q h us ...", prefill rows "LABEL mode h s_kv topk us ...". Prints, per case,
every variant's median time over the rounds, its spread (min-max) and median / current's.
"""
import collections
import statistics
import sys


def case_of(fields):
    """(case key, time in us) of one benchmark row without its variant name, or None."""
    if len(fields) >= 6 and fields[1] in ("flat", "direct"):
        return f"{fields[0]} {fields[1]} s_kv={fields[3]}", float(fields[5])
    if len(fields) >= 5 and fields[1].isdigit():
        return f"{fields[0]} b={fields[1]}", float(fields[4])
    return None


def main():
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    variants = []
    for line in open(sys.argv[1]):
        fields = line.split()
        if len(fields) < 2 or fields[1].endswith(":"):  # "NAME TEST_BINARY: [  PASSED  ] ..."
            continue
        parsed = case_of(fields[1:])
        if parsed is None:
            continue
        name, (case, us) = fields[0], parsed
        if name not in variants:
            variants.append(name)
        times[case][name].append(us)
    for case, by_variant in times.items():
        base = statistics.median(by_variant["current"]) if by_variant.get("current") else None
        cells = []
        for name in variants:
            values = by_variant.get(name)
            if not values:
                continue
            median = statistics.median(values)
            ratio = f" {median / base:5.3f}" if base else ""
            cells.append(f"{name} {median:9.2f} [{min(values):.2f}-{max(values):.2f}] n={len(values)}{ratio}")
        print(f"{case:28} " + " | ".join(cells))


if __name__ == "__main__":
    main()
