"""The committed weights' no-eviction accuracy on a small fixed prompt set.

    /usr/bin/python3 eval/model/weights_check.py --record   # after training: writes the record
    /usr/bin/python3 eval/model/weights_check.py            # checks the weights against it

The record (weights_accuracy.json) holds, per (task, length), the prompts' seed and count and how
many the plain numpy model answered right (tasks.is_correct); weights_test.py checks the
weights still do.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = os.path.join(HERE, "weights.npz")
RECORD = os.path.join(HERE, "weights_accuracy.json")
CELLS = [(task, length, 4) for length in (1024, 2048) for task in tasks.TASKS]
SEED = 424242  # prompts the training run never generated (its seeds are step-derived)


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def measure(model: numpy_model.Model, cells=CELLS) -> List[Dict[str, object]]:
    out = []
    for task, length, count in cells:
        correct = 0
        for example in tasks.examples(task, length, count, SEED):
            answer = model.generate(example.prompt, tasks.answer_budget(example), tasks.EOS)
            correct += tasks.is_correct(example, answer)
        out.append(dict(task=task, length=length, prompts=count, seed=SEED, correct=correct))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help="write the record instead of checking")
    args = ap.parse_args()
    model = numpy_model.Model.load(WEIGHTS)
    cells = measure(model)
    for c in cells:
        print(f"{c['task']:<18} T={c['length']:<5} {c['correct']}/{c['prompts']}")
    if args.record:
        with open(RECORD, "w") as f:
            json.dump({"weights_sha256": sha256(WEIGHTS), "cells": cells}, f, indent=1)
            f.write("\n")
        return 0
    with open(RECORD) as f:
        recorded = json.load(f)["cells"]
    return 0 if [c["correct"] for c in cells] == [c["correct"] for c in recorded] else 1


if __name__ == "__main__":
    sys.exit(main())
