"""Captures the small GQA model's prefill attention as entrokv traces (sim/trace.h's format).

    /usr/bin/python3 eval/model/capture_trace.py --weights eval/model/weights.npz \\
        --task single_needle --length 1024 --seed 3 --depth 0.5 --out TRACE_DIR

One trace per prompt: a directory with
  stats.npy        float32 [L, H_Q, T], the statistic (docs/architecture.md §3.1): by default
                   LAST_ROW (the attention row of the prompt's last query, over all T keys);
                   --statistic window_mean --window W gives the mean of the last W query rows;
  accumulated.npy  float32 [L, H_Q, T], the ACCUMULATED statistic (H2O): column sums of the
                   causal attention matrix over every prefill query, renormalized to sum to 1;
  trace.json       the metadata sim/trace.cc reads: model geometry, tokens, statistic, sink
                   tokens, the needle spans the answer depends on, and a source naming the model,
                   the weights' SHA-256, task, length, seed and depth. A "capture" object repeats
                   them as fields (the reader ignores members it does not know).

`entrokv eval --trace TRACE_DIR --out OUT` then runs the same report as on synthetic statistics.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402

MODEL_NAME = "entrokv-gqa-small"
SINK_TOKENS = 4
STATISTICS = ("last_row", "window_mean")


def weights_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def capture(model: numpy_model.Model, prompt: np.ndarray, statistic: str = "last_row",
            window: int = 32, accumulated: bool = True) -> Dict[str, np.ndarray]:
    """The statistic (and ACCUMULATED) of every layer for one prompt, from one prefill.

    LAST_ROW is the last query's row; WINDOW_MEAN the mean of the last `window` rows; both are
    probability rows over the causal prefix. ACCUMULATED is the mean over all T query rows: the
    column sums of the causal attention matrix divided by T, so it is normalized too.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    c = model.config
    tokens = len(prompt)
    rows = 1 if statistic == "last_row" else min(window, tokens)
    windows = sorted({rows, tokens} if accumulated else {rows})
    shape = (c.layers, c.query_heads, tokens)
    result = {"stats": np.zeros(shape, np.float32)}
    if accumulated:
        result["accumulated"] = np.zeros(shape, np.float32)

    def on_layer(layer: int, per_window: Dict[int, List[np.ndarray]]) -> None:
        # Per window, one [r, T] array per group; head h reads group h // r, so stacking the
        # groups in order gives head order.
        result["stats"][layer] = np.concatenate(per_window[rows], axis=0)
        if accumulated:
            result["accumulated"][layer] = np.concatenate(per_window[tokens], axis=0)

    # One prefill computes every window (a window of T rows is ACCUMULATED / T).
    logits = model.step(np.asarray(prompt), np.arange(tokens), numpy_model.DenseKV(c),
                        stat_rows=windows, on_layer=on_layer)
    result["next_token"] = np.asarray(int(np.argmax(logits[-1])))  # not part of the trace
    return result


def needle_records(example: tasks.Example) -> List[dict]:
    """The spans the answer depends on; depth = where the span starts, as a share of T."""
    tokens = len(example.prompt)
    return [{"begin": int(b), "end": int(e), "depth": round(b / tokens, 4)}
            for b, e in example.needle_spans]


def write_npy(path: str, array: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)


def write_trace(out_dir: str, model: numpy_model.Model, example: tasks.Example,
                arrays: Dict[str, np.ndarray], *, statistic: str, window: int,
                weights_hash: str, seed: int) -> None:
    c = model.config
    os.makedirs(out_dir, exist_ok=True)
    write_npy(os.path.join(out_dir, "stats.npy"), arrays["stats"])
    has_accumulated = "accumulated" in arrays
    if has_accumulated:
        write_npy(os.path.join(out_dir, "accumulated.npy"), arrays["accumulated"])
    elif os.path.exists(os.path.join(out_dir, "accumulated.npy")):
        os.remove(os.path.join(out_dir, "accumulated.npy"))
    tokens = len(example.prompt)
    stat_text = statistic if statistic == "last_row" else f"{statistic}(W={window})"
    capture_info = {"model": MODEL_NAME, "weights_sha256": weights_hash, "task": example.task,
                    "length": tokens, "seed": seed, "depth": example.depth,
                    "statistic": stat_text,
                    "answer": [int(t) for t in example.answer]}
    meta = {
        "format": "entrokv-trace",
        "version": 1,
        "model": {"name": MODEL_NAME, "layers": c.layers, "query_heads": c.query_heads,
                  "kv_groups": c.kv_heads, "head_dim": c.head_dim},
        "tokens": tokens,
        "statistic": statistic,
        "accumulated": has_accumulated,
        "sink_tokens": SINK_TOKENS,
        "needles": needle_records(example),
        "source": (f"{MODEL_NAME} (eval/model, numpy forward) weights sha256={weights_hash[:16]} "
                   f"task={example.task} length={tokens} seed={seed} depth={example.depth:.4f} "
                   f"statistic={stat_text}"),
        "capture": capture_info,
    }
    with open(os.path.join(out_dir, "trace.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def capture_example(model: numpy_model.Model, out_dir: str, task: str, length: int, seed: int,
                    depth: Optional[float], weights_hash: str, statistic: str = "last_row",
                    window: int = 32, accumulated: bool = True):
    """Makes the prompt, captures it and writes the trace; returns (example, arrays)."""
    example = tasks.make_example(task, length, seed, depth)
    arrays = capture(model, example.prompt, statistic, window, accumulated)
    write_trace(out_dir, model, example, arrays, statistic=statistic, window=window,
                weights_hash=weights_hash, seed=seed)
    return example, arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--weights", required=True, help="the model's .npz (train.py's export)")
    ap.add_argument("--task", required=True, choices=tasks.TASKS)
    ap.add_argument("--length", type=int, required=True, help="prompt length T in tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=float, help="needle depth in [0, 1]; default from the seed")
    ap.add_argument("--statistic", default="last_row", choices=STATISTICS)
    ap.add_argument("--window", type=int, default=32, help="W of window_mean")
    ap.add_argument("--no-accumulated", action="store_true", help="skip accumulated.npy")
    ap.add_argument("--out", required=True, help="trace directory to write")
    args = ap.parse_args()
    model = numpy_model.Model.load(args.weights)
    example, _ = capture_example(model, args.out, args.task, args.length, args.seed, args.depth,
                              weights_sha256(args.weights), args.statistic, args.window,
                              not args.no_accumulated)
    print(f"wrote {args.out}: {args.task} T={len(example.prompt)} depth={example.depth:.3f} "
          f"needles={list(example.needle_spans)}")


if __name__ == "__main__":
    main()
