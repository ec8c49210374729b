"""Which policies keep the needle: the pages of the answer's needle each policy keeps, per layer,
on the prompts of one evaluation cell, through the real daemon.

    export PYTHONPATH=build/client/python
    /usr/bin/python3 eval/model/needle_kept.py --weights eval/model/weights.npz \\
        --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
        --task single_needle --length 1024 --ratio 0.95 --seed 101 --question-excluded \\
        --policies mean+expattn+nb3max+pyramid,mean+expattn+nb5max+pyramid

The prompts are evaluate.py's (the same seed and count give the same prompts); each is prefilled
once and forked per policy as evaluate.py does (pool_worker.run_forked). After each fork's
decisions, the block tables say which pages of every (layer, group) are kept; a needle counts as
kept in a (layer, group) when every page of its span is (realtrace_report.needle_layer_records).
Prints a markdown report: per policy the answers, the share of (layer, group) pairs keeping the
whole needle, per layer; then the prompts where the first two policies disagree (with --layer L,
the pages of layer L each of the two keeps and the other does not, the needles' pages named).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import entrokv  # noqa: E402
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402
from realtrace_report import needle_layer_records, span_pages  # noqa: E402


def kept_pages(kv: pool_worker.PoolKV) -> List[List[set]]:
    """[layer][group]: the pages the fork's block tables still name."""
    return [[set(np.flatnonzero(groups >= 0).tolist()) for groups in layer] for layer in kv.tables]


def measure(worker: pool_worker.PoolWorker, example: tasks.Example,
            policies: Sequence[pool_worker.Policy], question_excluded: bool) -> List[dict]:
    """One prompt: per policy, whether it answered and [needle][layer][group] kept."""
    kept: Dict[str, list] = {}
    pages: Dict[str, List[List[set]]] = {}

    def on_decided(policy: pool_worker.Policy, kv: pool_worker.PoolKV) -> None:
        pages[policy.label()] = kept_pages(kv)
        kept[policy.label()] = needle_layer_records(pages[policy.label()], example.needle_spans,
                                                    worker.page_size)

    results = worker.run_forked(example, policies, question_excluded=question_excluded,
                                on_decided=on_decided)
    needles = [span_pages(begin, end, worker.page_size) for begin, end in example.needle_spans]
    return [{"correct": bool(r.correct), "kept": np.array(kept[r.policy], bool),
             "pages": pages[r.policy], "frames": r.kept_frames,
             "needle_pages": sum(len(n) for n in needles), "needles": needles}
            for r in results]


def page_differences(first: List[set], second: List[set], needles: Sequence[Sequence[int]]) -> str:
    """One layer's pages [group] kept by only one of two policies, as `g<group>: <first's> /
    <second's>` per group that differs; a page of the i-th needle's span reads `<page>(n<i>)`."""
    def named(pages: set) -> str:
        return " ".join(f"{p}" + "".join(f"(n{i + 1})" for i, needle in enumerate(needles)
                                         if p in needle) for p in sorted(pages)) or "none"
    return "; ".join(f"g{g}: {named(a - b)} / {named(b - a)}"
                     for g, (a, b) in enumerate(zip(first, second)) if a != b) or "the same"


def report(names: Sequence[str], rows: List[List[dict]], cell: str,
           layer: Optional[int] = None) -> str:
    """The markdown report; rows[prompt][policy]. With `layer`, the disagreements also list the
    pages of that layer only one of the first two policies keeps (page_differences)."""
    layers = rows[0][0]["kept"].shape[1]
    out = [f"# Needle pages kept: {cell}", "",
           f"{len(rows)} prompts. A needle is kept in a (layer, group) when every page of its "
           "span is; the shares are over prompts, needles and groups.", "",
           "| policy | answered | frames kept (mean) | whole needle kept (all layers) | "
           + " | ".join(f"layer {l}" for l in range(layers)) + " |",
           "|---|---|---|---|" + "---|" * layers]
    for i, name in enumerate(names):
        kept = np.stack([row[i]["kept"] for row in rows])  # [prompt, needle, layer, group]
        answered = sum(row[i]["correct"] for row in rows)
        frames = np.mean([row[i]["frames"] for row in rows])
        per_layer = [f"{100 * kept[:, :, l].mean():.1f}%" for l in range(layers)]
        out.append(f"| {name} | {answered} / {len(rows)} | {frames:.1f} | "
                   f"{100 * kept.mean():.1f}% | " + " | ".join(per_layer) + " |")
    if len(names) >= 2:
        a, b = names[0], names[1]
        out += ["", f"Prompts where {a} and {b} disagree: the share of (needle, layer, group) "
                "pairs each keeps whole; needle pages: the pages the needles' spans cover.", "",
                "| prompt | needle pages | answered by | " + f"{a} | {b} |"
                + ("" if layer is None else
                   f" layer {layer}: pages only {a} / only {b} keeps (n<i>: the i-th needle's) |"),
                "|---|---|---|---|---|" + ("" if layer is None else "---|")]
        for index, row in enumerate(rows):
            if row[0]["correct"] != row[1]["correct"]:
                winner = a if row[0]["correct"] else b
                pages = ("" if layer is None else " " + page_differences(
                    row[0]["pages"][layer], row[1]["pages"][layer], row[0]["needles"]) + " |")
                out.append(f"| {index} | {row[0]['needle_pages']} | {winner} | "
                           f"{100 * row[0]['kept'].mean():.1f}% | "
                           f"{100 * row[1]['kept'].mean():.1f}% |" + pages)
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--entrokvd", default="entrokvd")
    ap.add_argument("--entrokv", default="entrokv")
    ap.add_argument("--task", default="single_needle", choices=tasks.TASKS)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=300, help="evaluate.py's --prompts")
    ap.add_argument("--seed", type=int, required=True, help="evaluate.py's --seed")
    ap.add_argument("--ratio", type=float, required=True)
    ap.add_argument("--policies", required=True, help="comma-separated, evaluate.py's spellings")
    ap.add_argument("--question-excluded", action="store_true")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--layer", type=int,
                    help="list the pages of this layer only one of the first two policies keeps "
                         "on the prompts they disagree on")
    args = ap.parse_args(argv)

    registry = policy_registry.load(args.entrokv)
    try:
        policies = pool_worker.parse_policies(args.policies, args.ratio)
        for policy in policies:
            registry.info(policy.name)  # ValueError naming the registered policies
    except ValueError as error:
        ap.error(f"--policies: {error}")
    model = numpy_model.Model.load(args.weights)
    if args.layer is not None and not 0 <= args.layer < model.config.layers:
        ap.error(f"--layer: the model has layers 0 to {model.config.layers - 1}, "
                 f"got {args.layer}")
    daemon = pool_worker.LocalDaemon(args.entrokvd)
    rows = []
    try:
        with entrokv.Client(daemon.address, timeout_s=120) as client:
            worker = pool_worker.PoolWorker(client, model, registry, page_size=args.page_size)
            try:
                for index in range(args.prompts):
                    example = tasks.example_at(args.task, args.length, args.prompts, index,
                                               args.seed)
                    rows.append(measure(worker, example, policies, args.question_excluded))
                    if (index + 1) % 25 == 0:
                        print(f"  {index + 1}/{args.prompts} prompts", file=sys.stderr)
            finally:
                worker.close()
    finally:
        daemon.stop()
    setting = "the question excluded" if args.question_excluded else "the question in"
    cell = (f"{args.task} {args.length} tokens, ratio {args.ratio}, seed {args.seed}, "
            f"{setting}")
    text = report([p.label() for p in policies], rows, cell, args.layer)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
