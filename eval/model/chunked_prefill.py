#!/usr/bin/python3
"""Chunked prefill with a decision after every chunk, against one decision at the end of the
prompt, on the trained model served through entrokvd's pool (pool_worker.PoolWorker).

Per prompt and policy, with the same budget (K pages per layer and KV group) and the same
statistic (ACCUMULATED column sums) in every arm:
  end       one prefill of the whole prompt, one decision on its column sums (a fork of one
            shared prefill per policy), as pool_worker does;
  chunkC    the prompt prefilled in chunks of C tokens: per chunk, AppendTokens, the chunk run
            through the model attending to the pages still held, then a decision on the chunk's
            column sums with LayerStatistic.accumulate (the daemon adds them to its running
            sums), so each chunk's queries see only what earlier decisions kept.
plus "none" (no eviction) for reference. The answer is decoded greedily after the prefill.
Reported per arm: accuracy with its Wilson 95% interval, the peak frames the sequence held
during the prefill, and the paired comparison of each chunked arm with "end" (prompts only one
of the two answered right; exact McNemar p).

  PYTHONPATH=build/client/python nice -n 10 /usr/bin/python3 eval/model/chunked_prefill.py \\
      --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
      --weights eval/model/weights.npz --out docs/evaluation/chunked-prefill
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
from significance import discordant, mcnemar, wilson  # noqa: E402
import tasks  # noqa: E402

import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)

FIELDS = ("task", "prompt", "seed", "depth", "policy", "arm", "correct", "peak_frames",
          "kept_frames", "prompt_frames", "answer")


def readable_positions(kv: pool_worker.PoolKV, layer: int, group: int) -> np.ndarray:
    """The positions PoolKV.read returns for (layer, group), in the same order (ascending):
    the order of the columns of the model's statistic."""
    b = kv.worker.page_size
    pages_total = -(-kv.length // b)
    table = kv.tables[layer, group, :pages_total]
    pages = np.flatnonzero(table >= 0)
    positions = (pages[:, None] * b + np.arange(b)[None, :]).reshape(-1)
    positions = positions[positions < kv.length]
    return positions[kv.valid[layer, group, positions]]


def chunked_prefill(worker: pool_worker.PoolWorker, prompt: np.ndarray, chunk: int,
                    policy: pool_worker.Policy) -> tuple:
    """Opens a sequence and prefills `prompt` chunk by chunk, deciding after each chunk on its
    column sums (accumulate). Returns (kv, peak frames during the prefill)."""
    c = worker.model.config
    group_size = c.query_heads // c.kv_heads
    sid = worker._new_id("chunked")
    worker.client.open_sequence(worker.model_id, sid, initial_tokens=0)
    kv = pool_worker.PoolKV(worker, sid, 0)
    peak = 0
    try:
        for start in range(0, len(prompt), chunk):
            end = min(start + chunk, len(prompt))
            worker.append(kv, end - start)
            peak = max(peak, kv.live_frames())
            sums = np.zeros((c.layers, c.query_heads, end), np.float32)

            def keep(layer, stat):
                # stat[g]: the mean over the chunk's queries of their attention, [group_size,
                # T_g] over the positions the group still holds: times the rows, column sums.
                heads = sums[layer]  # [query_heads, end], a view
                for g in range(c.kv_heads):
                    columns = readable_positions(kv, layer, g)
                    heads[g * group_size:(g + 1) * group_size, columns] = (
                        stat[g] * np.float32(end - start))

            logits = worker.model.step(prompt[start:end], np.arange(start, end), kv,
                                       end - start, keep)
            worker.client.decide(worker.model_id, sid, sums, pages=policy.pages,
                                 policy=policy.name, kind="accumulated", accumulate=True,
                                 **dict(policy.params))
            worker._fetch_tables(kv)
        kv.prefill_logits = logits
        return kv, peak
    except BaseException:
        worker._close_quietly(kv)
        raise


def run_prompt(worker: pool_worker.PoolWorker, example: tasks.Example, names: Sequence[str],
               pages: int, chunks: Sequence[int]) -> List[Dict[str, object]]:
    rows: List[Dict[str, object]] = []
    budget = tasks.answer_budget(example)

    def record(policy: str, arm: str, kv: pool_worker.PoolKV, peak: int, prompt_frames: int):
        kept = kv.live_frames()
        answer, _ = worker.decode(kv, budget)
        rows.append(dict(policy=policy, arm=arm, correct=int(tasks.is_correct(example, answer)),
                         peak_frames=peak, kept_frames=kept, prompt_frames=prompt_frames,
                         answer=" ".join(map(str, answer))))

    # One prefill, forked per policy: "none" and each policy's decision at the end.
    parent, _ = worker.prefill(example.prompt, kinds=("accumulated",))
    try:
        prompt_frames = parent.live_frames()
        for name in ("none", *names):
            child = worker.fork(parent)
            try:
                if name != "none":
                    worker.decide(child, pool_worker.Policy(name, pages=pages,
                                                            statistic="accumulated"))
                record(name, "none" if name == "none" else "end", child, prompt_frames,
                       prompt_frames)
            finally:
                worker.close_sequence(child)
    finally:
        worker.close_sequence(parent)
    for chunk in chunks:
        for name in names:
            kv, peak = chunked_prefill(worker, example.prompt, chunk,
                                       pool_worker.Policy(name, pages=pages))
            try:
                record(name, f"chunk{chunk}", kv, peak, prompt_frames)
            finally:
                worker.close_sequence(kv)
    return rows


def summarize(rows: List[Dict[str, str]], names: Sequence[str],
              chunks: Sequence[int]) -> str:
    arms = ["end"] + [f"chunk{c}" for c in chunks]
    by = {(r["policy"], r["arm"], r["task"], r["prompt"]): r for r in rows}
    prompts = sorted({(r["task"], r["prompt"]) for r in rows})
    n = len(prompts)
    none = sum(int(by[("none", "none", t, p)]["correct"]) for t, p in prompts)
    low, high = wilson(none, n)
    lines = [f"{n} prompts. No eviction: {none}/{n} = {100 * none / n:.1f}% "
             f"[{100 * low:.1f}, {100 * high:.1f}].", "",
             "| policy | arm | accuracy [Wilson 95%] | peak frames (mean) | kept after prefill "
             "| vs end: +b / -w (McNemar p) |",
             "|---|---|---|---|---|---|"]
    for name in names:
        for arm in arms:
            cell = [by[(name, arm, t, p)] for t, p in prompts]
            correct = sum(int(r["correct"]) for r in cell)
            low, high = wilson(correct, n)
            peak = np.mean([int(r["peak_frames"]) for r in cell])
            kept = np.mean([int(r["kept_frames"]) for r in cell])
            paired = "-"
            if arm != "end":
                better, worse = discordant(
                    [int(r["correct"]) for r in cell],
                    [int(by[(name, "end", t, p)]["correct"]) for t, p in prompts])
                p = mcnemar(better, worse)
                paired = f"+{better} / -{worse} (p {'< 0.001' if p < 0.001 else f'= {p:.3f}'})"
            lines.append(f"| {name} | {arm} | {correct}/{n} = {100 * correct / n:.1f}% "
                         f"[{100 * low:.1f}, {100 * high:.1f}] | {peak:.0f} | {kept:.0f} | "
                         f"{paired} |")
    lines.append("")
    lines.append("Per task (correct of the task's prompts):")
    lines.append("")
    task_names = sorted({t for t, _ in prompts})
    lines.append("| policy | arm | " + " | ".join(task_names) + " |")
    lines.append("|---|---|" + "---|" * len(task_names))
    for name, arm in [("none", "none")] + [(p, a) for p in names for a in arms]:
        counts = []
        for task in task_names:
            cell = [by[(name, arm, t, p)] for t, p in prompts if t == task]
            counts.append(f"{sum(int(r['correct']) for r in cell)}/{len(cell)}")
        lines.append(f"| {name} | {arm} | " + " | ".join(counts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="entrokvd address; default: start --entrokvd privately")
    parser.add_argument("--entrokvd", default="entrokvd")
    parser.add_argument("--entrokv", default="entrokv", help="the CLI (the policy registry)")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--prompts", type=int, default=100, help="prompts, spread over the tasks")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--chunks", default="256,512")
    parser.add_argument("--policies", default="h2o,page_entrokv")
    parser.add_argument("--ratio", type=float, default=0.75,
                        help="compression ratio at the end of the prompt: K = (1 - ratio) x "
                             "the prompt's pages, the same K after every chunk")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", required=True, help="folder for results.csv and summary.md")
    args = parser.parse_args(argv)

    registry = policy_registry.load(args.entrokv)
    names = [n for n in args.policies.split(",") if n]
    for name in names:
        if name not in registry:
            parser.error(f"--policies: unknown policy {name}")
    chunks = [int(c) for c in args.chunks.split(",") if c]
    page_size = 16
    pages = int(np.ceil((1.0 - args.ratio) * -(-args.length // page_size)))
    per_task = -(-args.prompts // len(tasks.TASKS))
    examples = [(task, i, tasks.example_at(task, args.length, per_task, i, args.seed))
                for task in tasks.TASKS for i in range(per_task)][:args.prompts]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.csv")
    daemon = None if args.server else pool_worker.LocalDaemon(args.entrokvd)
    started = time.perf_counter()
    try:
        with entrokv.Client(args.server or daemon.address, timeout_s=120) as client:
            worker = pool_worker.PoolWorker(client, numpy_model.Model.load(args.weights),
                                            registry, page_size=page_size,
                                            model_id=f"chunked-prefill-{os.getpid()}",
                                            capacity_frames=4096)
            try:
                with open(path, "w", newline="") as out:
                    writer = csv.DictWriter(out, FIELDS)
                    writer.writeheader()
                    for k, (task, index, example) in enumerate(examples):
                        for row in run_prompt(worker, example, names, pages, chunks):
                            writer.writerow(dict(task=task, prompt=index, seed=args.seed,
                                                 depth=f"{example.depth:.3f}", **row))
                        out.flush()
                        print(f"{k + 1}/{len(examples)} prompts, "
                              f"{time.perf_counter() - started:.0f} s", flush=True)
                stats = client.pool_stats(worker.model_id)
            finally:
                worker.close(unregister=True)
    finally:
        if daemon is not None:
            daemon.stop()
    with open(path) as data:
        rows = list(csv.DictReader(data))
    summary = (f"T = {args.length}, K = {pages} pages per (layer, group) after every decision "
               f"(ratio {args.ratio} at the end of the prompt), page size {page_size}, group "
               f"layout, seed {args.seed}, {time.perf_counter() - started:.0f} s.\n\n"
               + summarize(rows, names, chunks))
    with open(os.path.join(args.out, "summary.md"), "w") as out:
        out.write(summary)
    print(summary)
    # Every sequence is closed: a frame still in use is a leak.
    return 0 if stats.used_frames == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
