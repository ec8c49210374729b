"""The plain model's no-eviction score on one (task, length) cell, graded two ways: ours
(tasks.is_correct, all or nothing) and RULER's string_match_all (tasks.ruler_credit).

    /usr/bin/python3 eval/model/ruler_metric.py --task multi_value --length 2048

The defaults are the report's prompts (300, seed 7); a 2K cell takes about 12 minutes on one core.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402
from weights_check import WEIGHTS  # noqa: E402  (the committed weights)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=WEIGHTS)
    ap.add_argument("--task", choices=tasks.TASKS, required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    model = numpy_model.Model.load(args.weights)
    correct, credit, missed = 0, 0.0, collections.Counter()
    for i in range(args.prompts):
        example = tasks.example_at(args.task, args.length, args.prompts, i, args.seed)
        out = model.generate(example.prompt, tasks.answer_budget(example), tasks.EOS)
        right, part = tasks.is_correct(example, out), tasks.ruler_credit(example, out)
        correct += right
        credit += part
        if not right:
            missed[round(part, 3)] += 1
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{args.prompts} prompts", file=sys.stderr, flush=True)
    n = args.prompts
    print(f"{args.task} T={args.length}, {n} prompts (seed {args.seed}), no eviction:")
    print(f"  exact (ours):           {correct}/{n} = {100 * correct / n:.1f}%")
    print(f"  RULER string_match_all: {100 * credit / n:.1f}%")
    print("  misses by RULER credit: " +
          (", ".join(f"{k:g}: {v}" for k, v in sorted(missed.items())) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
