"""Where two policies of a report decide alike: for every pair of policies, on how many
(prompt, ratio) pairs of the main pass their answers differ (and which one was right) and on
how many they kept different frames. Two spellings that agree on every prompt are the same
decision; a pair that differs on a handful is a detail the goal cannot see.

    /usr/bin/python3 eval/model/agreement.py --out docs/evaluation/<report>

writes <report>/agreement.md from its results.csv (or results.csv.gz).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import verdict  # noqa: E402


def agreement(rows: Sequence[Dict[str, str]]) -> List[Dict[str, object]]:
    """One record per pair of policies (in the order they first occur, "none" left out):
    pairs measured by both, answers that differ (a_only right, b_only right), frames that
    differ."""
    outcome: Dict[Tuple[str, ...], Dict[str, Tuple[int, int]]] = {}
    order: List[str] = []
    for r in rows:
        if (int(r["page_size"]), r["layout"]) != verdict.MAIN or r["policy"] == "none":
            continue
        if r["policy"] not in order:
            order.append(r["policy"])
        key = (r["task"], r["length"], r["prompt"], r["ratio"])
        outcome.setdefault(key, {})[r["policy"]] = (int(r["correct"]), int(r["kept_frames"]))
    records = []
    for a, b in itertools.combinations(order, 2):
        both = [(v[a], v[b]) for v in outcome.values() if a in v and b in v]
        records.append({
            "a": a, "b": b, "pairs": len(both),
            "a_only": sum(1 for x, y in both if x[0] > y[0]),
            "b_only": sum(1 for x, y in both if y[0] > x[0]),
            "frames_differ": sum(1 for x, y in both if x[1] != y[1])})
    return records


def markdown(records: Sequence[Dict[str, object]]) -> str:
    lines = ["# Where the policies decide alike", "",
             "Main pass (page size 16, GROUP layout): for each pair of policies, the (prompt, "
             "ratio) pairs both measured, those where only one answered correctly, and those "
             "where they kept different frames.", "",
             "| a | b | pairs | answers differ | a only right | b only right | frames differ |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['a']} | {r['b']} | {r['pairs']} | {r['a_only'] + r['b_only']} | "
                     f"{r['a_only']} | {r['b_only']} | {r['frames_differ']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a report's folder (its results.csv[.gz])")
    args = ap.parse_args(argv)
    try:
        rows = evaluate.read_results(args.out)
    except FileNotFoundError:
        ap.error(f"--out: {args.out} holds no results.csv or results.csv.gz")
    path = os.path.join(args.out, "agreement.md")
    with open(path, "w") as f:
        f.write(markdown(agreement(rows)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
