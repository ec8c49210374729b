"""How a cover policy's quota is shared: per layer, how many of the pages the daemon keeps are the
question's (the cover rule's first pages) and how many the keys' ranking chose.

    export PYTHONPATH=build/client/python
    /usr/bin/python3 eval/model/cover_quota.py --weights eval/model/weights.npz \\
        --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
        --cells variable_tracking:2048,multi_value:1024 --ratios 0.875,0.95 \\
        --prompts 100 --seed 7 --policy mean+winexpcoverfwdsink50+pyramid

The prompts are evaluate.py's (the same seed and count give the same prompts). Each is prefilled
once, keeping the policy's question rows; per ratio a fork is decided by the daemon and its block
tables say which pages each (layer, group) kept. The cover rule's first pages are computed here
from the same rows as the daemon computes them (pool_worker.question_cover; pool_worker_test holds
that reference to the daemon's decisions): the pages the question's rows rank highest until they
hold the policy's share of its mass. A kept page is the question's when it is one of those, the
tail's when it is the page being written (kept anyway), and the keys' otherwise. Prints a
markdown table per cell and ratio: per layer the quota, the cover's length in pages (median over
prompts and groups), the kept pages that are the question's and the keys' (means), and the share
of (prompt, group) pairs in which the keys chose none.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import entrokv  # noqa: E402
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402
from needle_kept import kept_pages  # noqa: E402


def question_cover(rows: np.ndarray, per_group: int, page_size: int, kind: str) -> List[set]:
    """[group]: the cover rule's first pages for one layer's question rows [query_heads, tokens]
    under the cover kind `kind` (pool_worker.COVER: its share, kernel, pooling and sinks)."""
    share, kernel, forward, rank_sinks = pool_worker.COVER[kind]
    return [set(pool_worker.question_cover(pool_worker.group_mean(rows[start:start + per_group]),
                                           page_size, share / 100, kernel, forward, rank_sinks))
            for start in range(0, rows.shape[0], per_group)]


def split_kept(kept: set, cover: set, tail: int) -> Tuple[int, int]:
    """(the kept pages that are the question's, those the keys' ranking chose): the tail page is
    neither, it is kept anyway."""
    ranked = kept - {tail}
    question = len(ranked & cover)
    return question, len(ranked) - question


def measure(worker: pool_worker.PoolWorker, example: tasks.Example, policy_spelling: str,
            ratios: Sequence[float]) -> List[np.ndarray]:
    """One prompt: per ratio, [layer, group, 4] = (quota, cover length, question's kept pages,
    keys' kept pages)."""
    policies = [pool_worker.parse_policies(policy_spelling, r)[0] for r in ratios]
    kind = worker.kind(policies[0])
    c = worker.model.config
    per_group = c.query_heads // c.kv_heads
    parent, _ = worker.prefill(example.prompt, kinds=(kind,))
    try:
        covers = [question_cover(parent.stats[kind][layer], per_group, worker.page_size, kind)
                  for layer in range(c.layers)]
        tail = -(-parent.length // worker.page_size) - 1
        out = []
        for policy in policies:
            child = worker.fork(parent)
            try:
                decisions = worker.decide(child, policy)
                kept = kept_pages(child)
            finally:
                worker.close_sequence(child)
            counts = np.zeros((c.layers, c.kv_heads, 4), np.int64)
            for layer, decision in enumerate(decisions):
                for group in range(c.kv_heads):
                    cover = covers[layer][group]
                    counts[layer, group] = (decision.quota_pages, len(cover),
                                            *split_kept(kept[layer][group], cover, tail))
            out.append(counts)
        return out
    finally:
        worker.close_sequence(parent)


def report(policy: str, cells: Sequence[Tuple[str, int]], ratios: Sequence[float],
           counts: dict, header: str) -> str:
    """counts[(task, length, ratio)]: [prompt, layer, group, 4] (measure's fields)."""
    out = [f"# How {policy} shares its quota: {header}", "",
           "Per layer: the quota in pages per KV group (the tail page, kept anyway, among them); "
           "the cover's length, the pages the question's rows take before the keys' ranking "
           "(median over prompts and groups); the kept pages that are the question's and the "
           "keys' (means); the share of (prompt, group) pairs in which the keys chose no page.",
           ""]
    for task, length in cells:
        for ratio in ratios:
            data = counts[(task, length, ratio)]
            out += [f"## {task}, {length} tokens, ratio {ratio} ({len(data)} prompts)", "",
                    "| layer | quota | cover length | question's pages kept | keys' pages kept "
                    "| keys chose none |", "|---|---|---|---|---|---|"]
            for layer in range(data.shape[1]):
                d = data[:, layer]  # [prompt, group, 4]
                quota = np.unique(d[..., 0])
                quota_text = (str(quota[0]) if len(quota) == 1
                              else f"{quota.min()}-{quota.max()}")
                out.append(f"| {layer} | {quota_text} | {np.median(d[..., 1]):.0f} | "
                           f"{d[..., 2].mean():.1f} | {d[..., 3].mean():.1f} | "
                           f"{100 * (d[..., 3] == 0).mean():.0f}% |")
            out.append("")
    return "\n".join(out)


def parse_cells(text: str) -> List[Tuple[str, int]]:
    cells = []
    for item in text.split(","):
        task, _, length = item.partition(":")
        if task not in tasks.TASKS or not length.isdigit():
            raise ValueError(f"each cell is task:length with a task of {', '.join(tasks.TASKS)}, "
                             f"got {item!r}")
        cells.append((task, int(length)))
    return cells


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--entrokvd", default="entrokvd")
    ap.add_argument("--entrokv", default="entrokv")
    ap.add_argument("--cells", required=True, help="task:length,... e.g. multi_value:1024")
    ap.add_argument("--ratios", required=True, help="comma-separated, e.g. 0.875,0.95")
    ap.add_argument("--prompts", type=int, default=100, help="evaluate.py's --prompts")
    ap.add_argument("--seed", type=int, required=True, help="evaluate.py's --seed")
    ap.add_argument("--policy", default=pool_worker.DEFAULT_SPELLINGS["question_in"],
                    help="a cover spelling (evaluate.py's)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)

    try:
        cells = parse_cells(args.cells)
        ratios = [float(r) for r in args.ratios.split(",")]
    except ValueError as error:
        ap.error(f"--cells or --ratios: {error}")
    registry = policy_registry.load(args.entrokv)
    try:
        policy = pool_worker.parse_policies(args.policy, ratios[0])[0]
        registry.info(policy.name)
    except ValueError as error:
        ap.error(f"--policy: {error}")
    if pool_worker.statistic_kind(registry, policy) not in pool_worker.COVER:
        ap.error(f"--policy: {args.policy} is not a cover spelling (+winexpcover..., "
                 "evaluate.py --help)")
    model = numpy_model.Model.load(args.weights)
    daemon = pool_worker.LocalDaemon(args.entrokvd)
    counts = {}
    try:
        with entrokv.Client(daemon.address, timeout_s=120) as client:
            worker = pool_worker.PoolWorker(client, model, registry, page_size=args.page_size)
            try:
                for task, length in cells:
                    rows = []
                    for index in range(args.prompts):
                        example = tasks.example_at(task, length, args.prompts, index, args.seed)
                        rows.append(measure(worker, example, args.policy, ratios))
                        if (index + 1) % 25 == 0:
                            print(f"  {task} {length}: {index + 1}/{args.prompts} prompts",
                                  file=sys.stderr)
                    for i, ratio in enumerate(ratios):
                        counts[(task, length, ratio)] = np.stack([row[i] for row in rows])
            finally:
                worker.close()
    finally:
        daemon.stop()
    text = report(args.policy, cells, ratios, counts,
                  f"seed {args.seed}, {args.prompts} prompts per cell, the question in")
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
