"""Whether the prompts two policies answer differently hold a needle on the sink page: per
(task, length, ratio) cell of a report's main pass, the prompts only policy A answered and only
policy B answered, and how many of each (and of all the cell's prompts) have a needle of the
answer starting on the first page, where the sink tokens are; with --c, how many of the prompts
only B answered a third policy C answers, on page 0 and elsewhere.

    /usr/bin/python3 eval/model/sink_needles.py --out docs/evaluation/<report> --seed S \\
        --prompts N --a mean+winexpcoverfwd7+pyramid --b snapkv+pyramid \\
        --tasks multi_value --ratios 0.875

The prompts are remade from the seed and count (tasks.example_at, as evaluate.py makes them);
prints the markdown table and writes it to --table if given.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import tasks  # noqa: E402
import verdict  # noqa: E402


def needle_on_first_page(task: str, length: int, prompts: int, index: int, seed: int,
                         page_size: int) -> bool:
    """Whether a needle of prompt `index`'s answer starts on page 0."""
    example = tasks.example_at(task, length, prompts, index, seed)
    return min(begin for begin, _ in example.needle_spans) < page_size


def cells(rows: Sequence[Dict[str, str]], a: str, b: str, seed: int, prompts: int,
          task_names: Sequence[str], ratios: Sequence[float],
          c: Optional[str] = None) -> List[Dict[str, object]]:
    """One record per (task, length, ratio) of the main pass measured for both policies (and
    c, when given)."""
    outcome: Dict[Tuple[str, int, float], Dict[int, Dict[str, int]]] = {}
    for r in rows:
        if (int(r["page_size"]), r["layout"]) != verdict.MAIN or r["policy"] not in (a, b, c):
            continue
        if r["task"] not in task_names or float(r["ratio"]) not in ratios:
            continue
        key = (r["task"], int(r["length"]), float(r["ratio"]))
        outcome.setdefault(key, {}).setdefault(int(r["prompt"]), {})[r["policy"]] = int(
            r["correct"])
    page_size = verdict.MAIN[0]
    records = []
    for (task, length, ratio), by_prompt in sorted(outcome.items()):
        both = {i: v for i, v in by_prompt.items()
                if a in v and b in v and (c is None or c in v)}
        on_first = {i for i in both
                    if needle_on_first_page(task, length, prompts, i, seed, page_size)}
        a_only = [i for i, v in both.items() if v[a] > v[b]]
        b_only = [i for i, v in both.items() if v[b] > v[a]]
        record = {"task": task, "length": length, "ratio": ratio, "prompts": len(both),
                  "on_first": len(on_first), "a_only": len(a_only),
                  "a_only_first": len(on_first.intersection(a_only)),
                  "b_only": len(b_only), "b_only_first": len(on_first.intersection(b_only))}
        if c is not None:
            record["c_first"] = sum(both[i][c] for i in b_only if i in on_first)
            record["c_elsewhere"] = sum(both[i][c] for i in b_only if i not in on_first)
        records.append(record)
    return records


def markdown(records: Sequence[Dict[str, object]], a: str, b: str,
             c: Optional[str] = None) -> str:
    third = c is not None
    out = [f"Prompts only one of {a} (A) and {b} (B) answered, and how many of them hold a "
           "needle of the answer starting on the sink page (page 0)"
           + (f"; of those only B answered, how many {c} (C) answers." if third else "."), "",
           "| cell | prompts | with a needle on page 0 | only A right | of them on page 0 | "
           "only B right | of them on page 0 |"
           + (" C right, page 0 | C right, elsewhere |" if third else ""),
           "|---|---|---|---|---|---|---|" + ("---|---|" if third else "")]
    for r in records:
        out.append(f"| {r['task']} {r['length'] // 1024}K, {r['ratio']:g} | {r['prompts']} | "
                   f"{r['on_first']} | {r['a_only']} | {r['a_only_first']} | {r['b_only']} | "
                   f"{r['b_only_first']} |"
                   + (f" {r['c_first']} | {r['c_elsewhere']} |" if third else ""))
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the report's folder (its results.csv[.gz])")
    ap.add_argument("--seed", type=int, required=True, help="the report's --seed")
    ap.add_argument("--prompts", type=int, required=True, help="the report's --prompts")
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--c", help="a third policy: how many of the prompts only B answered it "
                                "answers")
    ap.add_argument("--tasks", default=",".join(tasks.TASKS))
    ap.add_argument("--ratios", default="0.25,0.5,0.75,0.875,0.95")
    ap.add_argument("--table", help="also write the table here")
    args = ap.parse_args(argv)
    records = cells(evaluate.read_results(args.out), args.a, args.b, args.seed, args.prompts,
                    args.tasks.split(","), [float(r) for r in args.ratios.split(",")], args.c)
    if not records:
        ap.error(f"no cell of {args.out} measures --a, --b (and --c)")
    text = markdown(records, args.a, args.b, args.c)
    print(text, end="")
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
