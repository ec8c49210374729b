"""Accuracy of the small GQA model under every eviction policy, with entrokvd as its KV cache.

    /usr/bin/python3 eval/model/evaluate.py --weights eval/model/weights.npz \\
        --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
        --out docs/evaluation/small-gqa
    (with PYTHONPATH=build/client/python)

The policies, their order in the tables and the statistic each one scores come from the policy
registry (`entrokv policies`, eval/model/policies.py).

Each prompt is prefilled once into the daemon's pool and forked per (policy, compression ratio)
with prefix sharing; each fork gets its decisions and a greedy decode (pool_worker.run_forked).
Rows are written as they finish (results.csv), so a stopped run keeps what it measured and
`--resume` (the same arguments) runs only what it had not; the summary (accuracy with Wilson 95%
intervals, frames kept), page_entrokv's paired comparisons with every other policy (exact
McNemar: paired.csv, paired.md) and the plots are made from that file (`--summarize-only` remakes
them without running anything; it also reads a committed report's results.csv.gz).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import gzip
import io
import os
import sys
import time
from typing import Dict, List, Sequence, Tuple

# One BLAS thread per process: --processes workers share the cores, and OpenBLAS's default (a
# thread per core in every worker) oversubscribes them; its idle threads spin.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
from significance import discordant, mcnemar, wilson  # noqa: E402,F401  (the report's arithmetic)
import tasks  # noqa: E402
import verdict  # noqa: E402
import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)

MODEL = "Small GQA model"  # the plots' name for it
RATIOS = (0.25, 0.5, 0.75, 0.875, 0.95)
FIELDS = ("task", "length", "page_size", "layout", "prompt", "depth", "policy", "ratio",
          "correct", "kept_frames", "prompt_frames", "freed_frames", "moved_frames", "decide_ms",
          "decode_ms")


# The policy grammar (+window, +expattn, +nb7max, +pyramid, +mass25, ...) is the worker's.
policy_of = pool_worker.policy_of


# ---- running ------------------------------------------------------------------------------------
_WORKER = None  # one PoolWorker per process
_QUESTION_EXCLUDED = False  # the context decided before the question (--question-excluded)


def _start_worker(address: str, weights: str, registry: policy_registry.Registry,
                  page_size: int, layout: str, tag: str, question_excluded: bool) -> None:
    global _WORKER, _QUESTION_EXCLUDED
    _QUESTION_EXCLUDED = question_excluded
    client = entrokv.Client(address, timeout_s=120)
    model = numpy_model.Model.load(weights)
    _WORKER = pool_worker.PoolWorker(client, model, registry, page_size=page_size,
                                     frame_layout=layout,
                                     model_id=f"eval-{layout}-b{page_size}-{tag}-{os.getpid()}")


def _run(job) -> List[Dict[str, object]]:
    task, length, index, seed, count, settings = job
    example = tasks.example_at(task, length, count, index, seed)
    policies = [policy_of(name, ratio) for name, ratio in settings]
    rows = []
    results = _WORKER.run_forked(example, policies, question_excluded=_QUESTION_EXCLUDED)
    for (name, ratio), result in zip(settings, results):
        rows.append(dict(task=task, length=length, page_size=_WORKER.page_size,
                         layout=_WORKER.pool.frame_layout, prompt=index,
                         depth=round(example.depth, 4), policy=name,
                         ratio=ratio, correct=int(result.correct),
                         kept_frames=result.kept_frames, prompt_frames=result.prompt_frames,
                         freed_frames=result.freed_frames,
                         moved_frames=moved_frames(result.decisions),
                         decide_ms=round(result.decide_ms, 2),
                         decode_ms=round(result.decode_ms, 2)))
    return rows


def _row_key(task, length, page_size, layout, prompt, policy, ratio) -> tuple:
    return (str(task), int(length), int(page_size), str(layout), int(prompt), str(policy),
            float(ratio))


def moved_frames(decisions) -> int:
    """Frames the groups keep beyond their quota K: what moved between the groups of a layer
    (policy.group_floor < 1); 0 with fixed quotas."""
    return sum(max(0, len(group.kept_pages) - decision.quota_pages)
               for decision in decisions for group in decision.groups)


def measured(path: str) -> set:
    """The (task, length, page size, layout, prompt, policy, ratio) rows results.csv holds,
    after dropping a last line cut off when a run was stopped mid-write."""
    if not os.path.exists(path):
        return set()
    with open(path, "rb+") as f:
        data = f.read()
        data = data[:data.rfind(b"\n") + 1]
        f.truncate(len(data))
    reader = csv.DictReader(io.StringIO(data.decode(), newline=""))
    if reader.fieldnames is not None and tuple(reader.fieldnames) != FIELDS:
        raise SystemExit(f"{path}: its columns are not this evaluate.py's ({', '.join(FIELDS)}); "
                         f"run into a new --out instead of resuming or appending")
    return {_row_key(r["task"], r["length"], r["page_size"], r["layout"], r["prompt"],
                     r["policy"], r["ratio"])
            for r in reader}


def run(args, settings: Sequence[Tuple[str, float]], page_size: int, layout: str,
        writer, out_file) -> None:
    """Every (task, length, prompt) with the settings not yet in args.measured (all of them
    unless --resume)."""
    jobs = []
    for length in args.lengths:
        for task in args.tasks:
            for i in range(0, args.prompts, args.every):
                todo = tuple(s for s in settings if _row_key(
                    task, length, page_size, layout, i, *s) not in args.measured)
                if todo:
                    jobs.append((task, length, i, args.seed, args.prompts, todo))
    if not jobs:
        print(f"  {layout} b{page_size}: every prompt already measured", flush=True)
        return
    started = time.time()
    with concurrent.futures.ProcessPoolExecutor(
            args.processes, initializer=_start_worker,
            initargs=(args.address, args.weights, args.registry, page_size, layout,
                      args.tag, args.question_excluded)) as pool:
        for done, rows in enumerate(pool.map(_run, jobs), 1):
            for row in rows:
                writer.writerow(row)
            out_file.flush()
            if done % 5 == 0 or done == len(jobs):
                rate = (time.time() - started) / done
                print(f"  {layout} b{page_size}: {done}/{len(jobs)} prompts, "
                      f"{rate:.1f} s each, about {rate * (len(jobs) - done) / 60:.0f} min left",
                      flush=True)


# ---- summarising --------------------------------------------------------------------------------
def model_name(weights: str | None) -> str:
    """The plots' name for the model: its group size when the weights are at hand."""
    if not weights or not os.path.exists(weights):
        return MODEL
    c = numpy_model.Model.load(weights).config
    return (f"{MODEL} ({c.layers} layers, {c.query_heads} query heads on {c.kv_heads} KV "
            f"heads, r = {c.group_size})")


def compressed_only(path: str) -> bool:
    """Whether only path.gz holds the rows (a committed report keeps results.csv.gz)."""
    return not os.path.exists(path) and os.path.exists(path + ".gz")


def read_results(out_dir: str) -> List[Dict[str, str]]:
    """results.csv's rows, or results.csv.gz's where only that is kept."""
    path = os.path.join(out_dir, "results.csv")
    if compressed_only(path):
        with gzip.open(path + ".gz", "rt", newline="") as f:
            return list(csv.DictReader(f))
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def refuse_duplicates(rows: Sequence[Dict[str, str]]) -> None:
    """Stops when a (prompt, setting) is in results.csv twice: it would count twice in the
    cell's accuracy and interval."""
    seen: Dict[tuple, int] = {}
    for line, r in enumerate(rows, start=2):
        key = _row_key(r["task"], r["length"], r["page_size"], r["layout"], r["prompt"],
                       r["policy"], r["ratio"])
        if key in seen:
            raise SystemExit(f"results.csv: line {line} measures again the (task, length, page "
                             f"size, layout, prompt, policy, ratio) {key} of line {seen[key]}; "
                             f"keep one of them")
        seen[key] = line


def summarize(out_dir: str, order: Sequence[str], reference: str = "page_entrokv",
              model: str = MODEL) -> List[Dict[str, object]]:
    """summary.csv, tables.md, the plots, paired.csv and paired.md (`reference` against each
    other policy), verdict.md and verdict.png (the goal checked for `reference`, verdict.py),
    standings.md (the goal checked for every policy in turn) from
    results.csv; `order` is the policies' order in the tables and plots (the registry's), `model`
    names the model in the plots' titles."""
    rows = read_results(out_dir)
    refuse_duplicates(rows)
    cells: Dict[tuple, List[dict]] = {}
    for r in rows:
        key = (r["task"], int(r["length"]), int(r["page_size"]), r["layout"], r["policy"],
               float(r["ratio"]))
        cells.setdefault(key, []).append(r)
    summary = []
    for key in sorted(cells):
        group = cells[key]
        n, correct = len(group), sum(int(r["correct"]) for r in group)
        low, high = wilson(correct, n)
        kept = np.mean([int(r["kept_frames"]) for r in group])
        prompt = np.mean([int(r["prompt_frames"]) for r in group])
        # Reports written before the column existed moved nothing.
        moved = np.mean([int(r.get("moved_frames") or 0) for r in group])
        summary.append(dict(task=key[0], length=key[1], page_size=key[2], layout=key[3],
                            policy=key[4], ratio=key[5], prompts=n, correct=correct,
                            accuracy=round(correct / n, 4), ci_low=round(low, 4),
                            ci_high=round(high, 4), kept_frames=round(float(kept), 1),
                            prompt_frames=round(float(prompt), 1),
                            kept_share=round(float(kept / prompt), 4),
                            moved_share=round(float(moved / kept), 4)))
    with open(os.path.join(out_dir, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    plot(summary, out_dir, order, reference, model)
    with open(os.path.join(out_dir, "tables.md"), "w") as f:
        f.write(tables(summary, order))
    pairs = comparisons(rows, reference)
    if pairs:
        with open(os.path.join(out_dir, "paired.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(pairs[0]))
            writer.writeheader()
            writer.writerows(pairs)
        with open(os.path.join(out_dir, "paired.md"), "w") as f:
            f.write(paired_tables(pairs, order))
        verdict.write(out_dir, rows, pairs, reference)
        present = {r["policy"] for r in rows} - {"none"}
        ranked = [p for p in order if p in present] + sorted(present - set(order))
        with open(os.path.join(out_dir, "standings.md"), "w") as f:
            f.write(verdict.standings(
                rows, lambda p: pairs if p == reference else comparisons(rows, p), ranked))
    return summary


def comparisons(rows: List[dict], reference: str = "page_entrokv") -> List[Dict[str, object]]:
    """`reference` against every other policy in the same (task, length, page size, layout,
    ratio), paired over the prompts both ran: `better` prompts only the reference answered,
    `worse` prompts only the other did, and the exact McNemar p."""
    # (task, length, page size, layout, ratio) -> policy -> prompt -> correct
    cells: Dict[tuple, Dict[str, Dict[int, int]]] = {}
    for r in rows:
        if r["policy"] == "none":
            continue
        key = (r["task"], int(r["length"]), int(r["page_size"]), r["layout"], float(r["ratio"]))
        cells.setdefault(key, {}).setdefault(r["policy"], {})[int(r["prompt"])] = int(r["correct"])
    out = []
    for key in sorted(k for k in cells if reference in cells[k]):
        mine = cells[key][reference]
        for other in sorted(set(cells[key]) - {reference}):
            theirs = cells[key][other]
            common = sorted(set(mine) & set(theirs))
            better, worse = discordant([mine[i] for i in common], [theirs[i] for i in common])
            out.append(dict(task=key[0], length=key[1], page_size=key[2], layout=key[3],
                            ratio=key[4], reference=reference, policy=other, prompts=len(common),
                            reference_correct=sum(mine[i] for i in common),
                            policy_correct=sum(theirs[i] for i in common), better=better,
                            worse=worse, p=round(mcnemar(better, worse), 4)))
    return out


def paired_tables(pairs: List[Dict[str, object]], order: Sequence[str]) -> str:
    """Markdown: per (task, length, page size, layout), the reference against each policy per
    ratio as `+better / -worse (p)`."""
    reference = pairs[0]["reference"]
    out = [f"# {reference} against each policy, paired over the same prompts\n",
           f"`+b / -w (p)`: b prompts only {reference} answered right, w prompts only the other "
           "policy did; p is the exact two-sided McNemar test on those b + w prompts. Every row "
           "is in `paired.csv`."]
    cells = sorted({(s["page_size"], s["layout"], s["task"], s["length"]) for s in pairs},
                   key=lambda c: (c[0], c[1], tasks.TASKS.index(c[2]), c[3]))
    for page_size, layout, task, length in cells:
        part = [s for s in pairs if (s["page_size"], s["layout"], s["task"], s["length"]) ==
                (page_size, layout, task, length)]
        ratios = sorted({s["ratio"] for s in part})
        by = {(s["policy"], s["ratio"]): s for s in part}
        out.append(f"\n**{task}, T = {length}, page size {page_size}, {layout} layout**\n")
        out.append("| against | " + " | ".join(f"ratio {r:g}" for r in ratios) + " |")
        out.append("|---|" + "---|" * len(ratios))
        for policy in _policies(part, order):
            out.append(f"| {policy} | " + " | ".join(
                _paired(by.get((policy, r))) for r in ratios) + " |")
    return "\n".join(out) + "\n"


def _paired(s) -> str:
    if s is None:
        return ""
    return f"+{s['better']} / -{s['worse']} ({verdict.format_p(s['p'])})"


def tables(summary: List[Dict[str, object]], order: Sequence[str]) -> str:
    """Markdown: accuracy per (task, length) as policy x ratio, then the frames kept."""
    out = []
    for (page_size, layout) in sorted({(s["page_size"], s["layout"]) for s in summary}):
        part = [s for s in summary if s["page_size"] == page_size and s["layout"] == layout]
        ratios = sorted({s["ratio"] for s in part if s["policy"] != "none"})
        for task in sorted({s["task"] for s in part}, key=tasks.TASKS.index):
            for length in sorted({s["length"] for s in part}):
                cell = {(s["policy"], s["ratio"]): s for s in part
                        if s["task"] == task and s["length"] == length}
                if not cell:
                    continue
                none = cell.get(("none", 0.0))
                prompts = (none or next(iter(cell.values())))["prompts"]
                out.append(f"\n**{task}, T = {length}, page size {page_size}, {layout} layout** "
                           f"({prompts} prompts; no eviction: "
                           f"{_pct(none) if none else 'n/a'})\n")
                if set(cell) == {("none", 0.0)}:
                    out.append("No eviction only: no policy was run on this task.")
                    continue
                out.append("| policy | " + " | ".join(f"ratio {r:g}" for r in ratios) + " |")
                out.append("|---|" + "---|" * len(ratios))
                for policy in _policies(part, order):
                    if any((policy, r) in cell for r in ratios):
                        # A later pass (--append) may have run fewer prompts: say so in the row.
                        counts = {cell[(policy, r)]["prompts"] for r in ratios
                                  if (policy, r) in cell}
                        label = policy if counts == {prompts} else (
                            f"{policy} ({'/'.join(str(c) for c in sorted(counts))} prompts)")
                        out.append(f"| {label} | " + " | ".join(
                            _pct(cell.get((policy, r))) for r in ratios) + " |")
        out.append(f"\n**Frames kept after the decisions, as a share of the prompt's frames "
                   f"(page size {page_size}, {layout} layout; mean over prompts and tasks)**\n")
        out.append("| policy | " + " | ".join(f"ratio {r:g}" for r in ratios) + " |")
        out.append("|---|" + "---|" * len(ratios))
        for policy in _policies(part, order):
            shares = []
            for r in ratios:
                rows = [s for s in part if s["policy"] == policy and s["ratio"] == r]
                shares.append(f"{100 * np.mean([s['kept_share'] for s in rows]):.1f}%"
                              if rows else "")
            if any(shares):
                out.append(f"| {policy} | " + " | ".join(shares) + " |")
        out.extend(_moved_table(part, order, ratios))
    return "\n".join(out) + "\n"


def _moved_table(part, order: Sequence[str], ratios) -> List[str]:
    """The frames the groups keep beyond their quota (moved between the groups of a layer by
    policy.group_floor) as a share of the frames kept, for the policies that moved any."""
    moving = [p for p in _policies(part, order)
              if any(s.get("moved_share", 0) > 0 for s in part if s["policy"] == p)]
    if not moving:
        return []
    out = ["\n**Frames kept beyond a group's quota K (moved between the groups of a layer), as a "
           "share of the frames kept (mean over prompts and tasks)**\n",
           "| policy | " + " | ".join(f"ratio {r:g}" for r in ratios) + " |",
           "|---|" + "---|" * len(ratios)]
    for policy in moving:
        shares = []
        for r in ratios:
            rows = [s for s in part if s["policy"] == policy and s["ratio"] == r]
            shares.append(f"{100 * np.mean([s['moved_share'] for s in rows]):.1f}%"
                          if rows else "")
        out.append(f"| {policy} | " + " | ".join(shares) + " |")
    return out


def _policies(part, order: Sequence[str]) -> List[str]:
    """The policies found in the data in `order`, then the others (name+window variants)
    sorted."""
    seen = {s["policy"] for s in part} - {"none"}
    return [p for p in order if p in seen] + sorted(seen - set(order))


def _pct(s) -> str:
    if s is None:
        return ""
    return f"{100 * s['accuracy']:.0f}% [{100 * s['ci_low']:.0f}, {100 * s['ci_high']:.0f}]"


def plot(summary: List[Dict[str, object]], out_dir: str, order: Sequence[str],
         reference: str = "page_entrokv", model: str = MODEL) -> None:
    """accuracy.png against the compression ratio; accuracy_memory.png against the frames a
    policy really keeps, where per-head selection's union shows (no eviction: 100%). The
    reference's line is the thick one."""
    figure = dict(order=order, reference=reference, model=model)
    _plot(summary, os.path.join(out_dir, "accuracy.png"), "ratio", 0.0,
          "compression ratio (share of KV evicted)", "accuracy vs compression", **figure)
    _plot(summary, os.path.join(out_dir, "accuracy_memory.png"), "kept_share", 1.0,
          "frames kept (share of the prompt's frames)", "accuracy vs the memory each policy keeps",
          **figure)


def _plot(summary: List[Dict[str, object]], path: str, x_field: str, x_baseline: float,
          x_label: str, title: str, order: Sequence[str], reference: str, model: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [s for s in summary if s["layout"] == "group" and s["page_size"] == 16]
    # Tasks measured with no eviction only have no curves to draw.
    task_names = sorted({s["task"] for s in main if s["policy"] != "none"}, key=tasks.TASKS.index)
    lengths = sorted({s["length"] for s in main})
    fig, axes = plt.subplots(len(lengths), len(task_names), squeeze=False,
                             figsize=(max(7.5, 4.2 * len(task_names)), 3.6 * len(lengths)),
                             sharey=True)
    colours = plt.get_cmap("tab20").colors
    for row, length in enumerate(lengths):
        for col, task in enumerate(task_names):
            ax = axes[row][col]
            cell = [s for s in main if s["task"] == task and s["length"] == length]
            baseline = [s for s in cell if s["policy"] == "none"]
            for n, policy in enumerate(_policies(cell, order)):
                points = sorted((s[x_field], s["accuracy"], s["ci_low"], s["ci_high"])
                                for s in cell if s["policy"] == policy)
                if not points:
                    continue
                if baseline:
                    points = sorted([(x_baseline, baseline[0]["accuracy"], baseline[0]["ci_low"],
                                      baseline[0]["ci_high"])] + points)
                x, y, lo, hi = (np.array(v) for v in zip(*points))
                style = dict(lw=2.2) if policy == reference else dict(lw=1.1, alpha=0.85)
                ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="o", ms=3, capsize=2,
                            label=policy, color=colours[n % len(colours)],
                            linestyle="--" if "+" in policy else "-", **style)
            ax.set_title(f"{task}, T = {length}", fontsize=10)
            ax.set_xlabel(x_label)
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel("exact-match accuracy")
    axes[0][0].legend(fontsize=7, loc="lower left", ncol=2)
    fig.suptitle(f"{model} with entrokvd as its KV cache\n{title} "
                 "(page size 16, Wilson 95% intervals; dashed: question-window statistic)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the command --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", help="the model's .npz")
    ap.add_argument("--out", required=True, help="folder for results.csv, summary.csv, plots")
    ap.add_argument("--server", help="entrokvd address; default: start --entrokvd privately")
    ap.add_argument("--entrokvd", default="entrokvd")
    ap.add_argument("--entrokv", default="entrokv",
                    help="the entrokv CLI: `entrokv policies` lists the policies and the "
                         "statistic each one scores")
    ap.add_argument("--tasks", default=",".join(tasks.TASKS))
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--prompts", type=int, default=300, help="per (task, length), depths 0-100%%")
    ap.add_argument("--policies",
                    help="comma list (name, or name+window / name+last for another statistic); "
                         "default: every registered policy")
    ap.add_argument("--ratios", default=",".join(str(r) for r in RATIOS))
    ap.add_argument("--also", default="b32:0.75,layer:0.75",
                    help="extra passes at one ratio: b32 (page size 32), layer (LAYER layout)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7,
                    help="the prompts' seed: 7 is the development set, every choice so far was "
                         "made on it; 101 is kept for confirmation (docs/evaluation/README.md)")
    ap.add_argument("--question-excluded", action="store_true",
                    help="decide the context before the question is seen (kvpress's default "
                         "setting): the statistics are the context's own, and the question runs "
                         "through the kept cache after the decision")
    ap.add_argument("--reference", default="page_entrokv",
                    help="the policy paired.md compares with every other")
    ap.add_argument("--every", type=int, default=1,
                    help="run only every K-th of the --prompts prompts (0, K, 2K, ...): a later "
                         "pass on a subset of the main pass's prompts, spread over all depths")
    ap.add_argument("--summarize-only", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="add rows to an existing results.csv (a later pass, e.g. +window "
                         "variants); the (prompt, setting) pairs it already holds are skipped")
    ap.add_argument("--resume", action="store_true",
                    help="continue a stopped run (the same arguments, --append too if it had "
                         "it): run only the (prompt, setting) pairs results.csv lacks")
    args = ap.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    if not args.summarize_only:
        if not args.weights:
            ap.error("--weights is required unless --summarize-only")
        if args.every < 1:
            ap.error(f"--every must be at least 1, got {args.every}")
        results = os.path.join(args.out, "results.csv")
        if compressed_only(results):
            ap.error(f"{results}.gz holds this folder's rows: gunzip it to add to them (or "
                     "remove it to start over); --summarize-only reads it as it is")
        args.registry = policy_registry.load(args.entrokv)
        args.tasks = [t for t in args.tasks.split(",") if t]
        args.lengths = [int(v) for v in args.lengths.split(",") if v]
        args.tag = f"{os.getpid()}"
        policies = ([p for p in args.policies.split(",") if p] if args.policies else
                    list(args.registry.names))
        for name in policies:
            if name.partition("+")[0] not in args.registry:
                ap.error(f"--policies: '{name}' is not one of {', '.join(args.registry.names)}")
        ratios = [float(r) for r in args.ratios.split(",") if r]
        daemon = None if args.server else pool_worker.LocalDaemon(
            args.entrokvd)
        args.address = args.server or daemon.address
        started = time.time()
        # A later pass (--append) measures only what results.csv lacks, as --resume does: a
        # (prompt, setting) measured twice would count twice in summary.csv.
        args.measured = measured(results) if args.resume or args.append else set()
        try:
            with open(results, "a" if args.append or args.resume else "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=FIELDS)
                if f.tell() == 0:
                    writer.writeheader()
                # A later pass (--append) adds settings to prompts whose no-eviction row exists.
                baseline = [] if args.append else [("none", 0.0)]
                main_settings = baseline + [(p, r) for r in ratios for p in policies]
                subset = f" (one in every {args.every})" if args.every > 1 else ""
                print(f"evaluating {len(args.tasks)} tasks x lengths {args.lengths} x "
                      f"{args.prompts} prompts{subset}, {len(main_settings)} settings each",
                      flush=True)
                run(args, main_settings, 16, "group", writer, f)
                for extra in (e for e in args.also.split(",") if e):
                    kind, ratio = extra.split(":")
                    settings = [("none", 0.0)] + [(p, float(ratio)) for p in policies]
                    page_size, layout = (32, "group") if kind == "b32" else (16, "layer")
                    run(args, settings, page_size, layout, writer, f)
        finally:
            if daemon is not None:
                daemon.stop()
        print(f"done in {(time.time() - started) / 60:.1f} min", flush=True)
    summary = summarize(args.out, policy_registry.load(args.entrokv).names, args.reference,
                        model_name(args.weights))
    print(f"{len(summary)} cells written to {os.path.join(args.out, 'summary.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
