"""Teacher-forced errors of weights on training's task forms: of the tokens a form teaches
(its answers and EOS), how many the model does not rank first when fed the true prefix.

    /usr/bin/python3 eval/model/copy_errors.py --weights eval/model/r8/phase2_mean4.npz \\
        --forms values,long_values --length 1024 --rows 32

Greedy answers hide most of a weak step (one prompt asks one key); the dense warm-ups ask every
fact of a prompt, so a few hundred taught tokens measure a copy step to a few percent where 80
prompts of a task measure it to ten. Rows are train.batch's, on seeds no training run draws
(from 900,000), at their own positions (0, 1, ...): the evaluation's, not a far_ form's spread.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import train  # noqa: E402
from weights_check import WEIGHTS  # noqa: E402  (the committed weights)

FIRST_SEED = 900_000  # training's batches draw seeds from its --seed x 10,000,019 up


def row_errors(forward, tokens: np.ndarray, targets: np.ndarray) -> tuple[int, int]:
    """(wrong, taught) for one row: targets[t] is the token after tokens[t] where it is taught
    (-100 elsewhere); forward(tokens) gives logits [T, vocab]."""
    taught = np.flatnonzero(targets != -100)
    if len(taught) == 0:
        return 0, 0
    end = int(taught[-1]) + 1  # padding after the last taught row changes nothing before it
    logits = forward(tokens[:end])
    wrong = int(np.sum(logits[taught].argmax(-1) != targets[taught]))
    return wrong, len(taught)


def form_errors(forward, form: str, length: int, rows: int) -> tuple[int, int, int]:
    """(wrong tokens, taught tokens, rows with a wrong token) over `rows` rows of `form`."""
    wrong = taught = bad_rows = 0
    for i in range(rows):
        x, y, _ = train.batch([form], length, 1, FIRST_SEED + i)
        w, t = row_errors(forward, x[0].numpy(), y[0].numpy())
        wrong, taught, bad_rows = wrong + w, taught + t, bad_rows + (w > 0)
    return wrong, taught, bad_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=WEIGHTS)
    ap.add_argument("--forms", default="values,twin_values,long_values,long_wide_recall,multi_value")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=32)
    args = ap.parse_args()
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in train.MIX_FORMS or f in train.FAR_WARM_UPS]
    if unknown:
        ap.error(f"--forms: unknown or spread (far_) form {', '.join(unknown)}")
    if args.rows < 1:
        ap.error(f"--rows must be at least 1, got {args.rows}")
    model = numpy_model.Model.load(args.weights)
    for form in forms:
        wrong, taught, bad = form_errors(model.forward, form, args.length, args.rows)
        print(f"{form} at {args.length}: {wrong} of {taught} taught tokens wrong "
              f"({100 * wrong / taught:.1f}%), {bad} of {args.rows} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
