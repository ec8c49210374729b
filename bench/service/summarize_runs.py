#!/usr/bin/env python3
"""Markdown tables from service_load_bench runs of two daemon builds taken in turn.

Usage: summarize_runs.py DIR
DIR holds before_N.json and after_N.json (service_load_bench --out=DIR/before_N, then
DIR/after_N, N = 1, 2, ...). Prints, per run kind (source x streams), the median over the runs
of each build, and the goals' figures of the after runs. Medians, because the shared machine's
noise moves single runs by 10-20%.
"""
import glob
import json
import os
import statistics
import sys


def load(directory, build):
    """The runs of one build, by their number N."""
    runs = {}
    for path in glob.glob(os.path.join(directory, f"{build}_*.json")):
        number = os.path.basename(path)[len(build) + 1:-len(".json")]
        if number.isdigit():
            with open(path) as f:
                runs[int(number)] = json.load(f)
    return runs


def by_kind(runs):
    """(source, streams) -> {N: row}."""
    kinds = {}
    for number, run in runs.items():
        for row in run["runs"]:
            kinds.setdefault((row["source"], row["streams"]), {})[number] = row
    return kinds


def median(rows, field):
    values = [row[field] for row in rows.values() if field in row]
    return statistics.median(values) if values else float("nan")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    before, after = load(directory, "before"), load(directory, "after")
    if not before or not after:
        sys.exit(f"{directory}: no before_N.json or after_N.json")
    kinds_before, kinds_after = by_kind(before), by_kind(after)
    print(f"{len(before)} runs of each build, in turn; medians. \"lower after\": in how many of "
          "the pairs (the two builds' runs of the same number) the after build's daemon used less "
          "CPU per decision.\n")
    print("| source | streams | decisions/s before | after | p50 ms before | after | "
          "daemon CPU ms per decision before | after | lower after | core ms (after runs) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in sorted(kinds_after, key=lambda k: (k[0] != "none", k[0], k[1])):
        b, a = kinds_before.get(kind, {}), kinds_after[kind]
        pairs = sorted(set(b) & set(a))
        lower = sum(1 for n in pairs if a[n]["daemon_cpu_ms_per_decision"] <
                    b[n]["daemon_cpu_ms_per_decision"])
        print(f"| {kind[0]} | {kind[1]} | {median(b, 'decisions_per_s'):.0f} | "
              f"{median(a, 'decisions_per_s'):.0f} | {median(b, 'p50_ms'):.3f} | "
              f"{median(a, 'p50_ms'):.3f} | {median(b, 'daemon_cpu_ms_per_decision'):.3f} | "
              f"{median(a, 'daemon_cpu_ms_per_decision'):.3f} | {lower} of {len(pairs)} | "
              f"{median(a, 'core_ms_per_layer'):.3f} |")
    print()
    rows = {i: row for i, row in enumerate(row for run in after.values() for row in run["runs"])}
    print("References measured before each of the after runs (medians): "
          f"core {median(rows, 'core_ms_per_layer'):.3f} ms, "
          f"empty round trip p50 {median(rows, 'round_trip_p50_ms') * 1000:.0f} us, "
          f"memcpy of a statistic {median(rows, 'copy_ms_per_layer'):.3f} ms, "
          f"its pread {median(rows, 'pread_ms_per_layer'):.3f} ms.\n")
    print("| goal (after runs) | " + " | ".join(f"run {i + 1}" for i in range(len(after))) + " |")
    print("|---|" + "---|" * len(after))
    cells = {}
    for _, run in sorted(after.items()):
        for row in run["runs"]:
            goal = row.get("goal")
            if goal is None:
                continue
            kind = f"{row['source']} x{row['streams']}"
            if "p50_bound_ms" in goal:
                text = (f"p50 {row['p50_ms']:.3f} vs {goal['p50_bound_ms']:.3f} ms: "
                        f"{'met' if goal['met'] else 'missed'}")
                cells.setdefault(f"{kind}: p50 <= core + 1.2 rtt"
                                 f"{' + copy' if row['source'] == 'bytes' else ''}", []).append(text)
                if "p50_bound_with_pread_ms" in goal:
                    cells.setdefault(f"{kind}: p50 <= core + pread + 1.2 rtt", []).append(
                        f"p50 {row['p50_ms']:.3f} vs {goal['p50_bound_with_pread_ms']:.3f} ms: "
                        f"{'met' if goal['met_with_pread'] else 'missed'}")
            else:
                cells.setdefault(f"{kind}: >= 85% of threads / core", []).append(
                    f"{100 * goal['share']:.0f}% of {goal['threads_over_core_per_s']:.0f}/s: "
                    f"{'met' if goal['met'] else 'missed'}")
    for name, texts in cells.items():
        print(f"| {name} | " + " | ".join(texts) + " |")


if __name__ == "__main__":
    main()
