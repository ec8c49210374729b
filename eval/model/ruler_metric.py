"""The plain model's no-eviction score on one (task, length) cell, graded two ways: ours
(tasks.is_correct, all or nothing) and RULER's string_match_all (tasks.ruler_credit).

    /usr/bin/python3 eval/model/ruler_metric.py --task multi_value --length 2048

The defaults are the report's prompts (300, seed 7); a 2K cell takes about 12 minutes on one core.
Two sets of weights compare on the same prompts, paired: `--answers A.json` keeps which prompts
one answered, and a later run with `--against A.json` counts the prompts it fixed and newly
missed, with their exact McNemar p:

    ruler_metric.py --weights old.npz --task multi_value --length 1024 --prompts 80 \
        --seed 31337 --answers old.json
    ruler_metric.py --weights new.npz --task multi_value --length 1024 --prompts 80 \
        --seed 31337 --against old.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402
from significance import discordant, mcnemar  # noqa: E402
from weights_check import WEIGHTS  # noqa: E402  (the committed weights)


def cell_of(args) -> dict:
    """What makes two runs' prompts the same: a comparison is refused unless these agree."""
    return {"task": args.task, "length": args.length, "prompts": args.prompts, "seed": args.seed}


def read_answers(path: str, cell: dict) -> List[bool]:
    """The per-prompt answers an earlier `--answers` wrote, for the same prompts as `cell`."""
    with open(path) as f:
        saved = json.load(f)
    for key, value in cell.items():
        if saved.get(key) != value:
            raise ValueError(f"{path} answered other prompts: its {key} is {saved.get(key)!r}, "
                             f"this run's {value!r}")
    if len(saved["correct"]) != cell["prompts"]:
        raise ValueError(f"{path} holds {len(saved['correct'])} answers for "
                         f"{cell['prompts']} prompts")
    return [bool(c) for c in saved["correct"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=WEIGHTS)
    ap.add_argument("--task", choices=tasks.TASKS, required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--answers", help="write which prompts were answered here (JSON)")
    ap.add_argument("--against", help="an earlier --answers file for the same prompts: count "
                                      "the prompts fixed and newly missed against it")
    args = ap.parse_args()
    before = None
    if args.against:
        try:
            before = read_answers(args.against, cell_of(args))
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--against: {e}")
    model = numpy_model.Model.load(args.weights)
    correct, credit, missed = 0, 0.0, collections.Counter()
    answered = []
    for i in range(args.prompts):
        example = tasks.example_at(args.task, args.length, args.prompts, i, args.seed)
        out = model.generate(example.prompt, tasks.answer_budget(example), tasks.EOS)
        right, part = tasks.is_correct(example, out), tasks.ruler_credit(example, out)
        correct += right
        credit += part
        answered.append(bool(right))
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
    if before is not None:
        fixed, newly = discordant(answered, before)
        print(f"  against {args.against} ({sum(before)}/{n}): fixed {fixed}, newly missed "
              f"{newly}, exact McNemar p = {mcnemar(fixed, newly):.3f}")
    if args.answers:
        with open(args.answers, "w") as f:
            json.dump({**cell_of(args), "weights": args.weights, "correct": answered}, f)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
