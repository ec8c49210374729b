#!/usr/bin/python3
"""Peer comparison: the entrokv fused CPU core against the same math written plainly in PyTorch.

One run of this script generates one seeded whole-model statistic, hands it to the C++ runner
(`entrokv bench core --input`, or the dev binary `entrokv_bench_dev`) through a .npy file, times
PyTorch (eager, CPU, one thread) on the same array in this process, checks that both keep the
same pages in every (layer, group), and prints the ratios.

Needs Debian's python3-torch and python3-numpy: run it with /usr/bin/python3.

  /usr/bin/python3 bench/core/peer_torch.py --runner "build/client/cli/entrokv bench" \
      --out bench/results/core_peer_torch.json
"""

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

EPS_LOG = 1e-12


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def seeded_statistic(seed, layers, heads, tokens):
    """Attention-like rows: heavy tails of per-head sharpness, large sink tokens."""
    rng = np.random.default_rng(seed)
    out = np.empty((layers, heads, tokens), dtype=np.float32)
    for layer in range(layers):
        for head in range(heads):
            u = rng.random(tokens, dtype=np.float32)
            out[layer, head] = u ** int(rng.integers(1, 13))
        out[layer, :, :4] += 8.0
    return out


def plan_budget(layers, groups, page_size, tokens, fraction):
    """PlanBudget (core/scoring/budget.cc) for the uniform allocator: K_l per layer."""
    layer_pages = math.floor(fraction * tokens * layers / page_size)
    spare = layer_pages - layers
    shares = [spare * 1.0 / layers for _ in range(layers)]
    quotas = [math.floor(s) for s in shares]
    remainders = [s - q for s, q in zip(shares, quotas)]
    order = sorted(range(layers), key=lambda l: -remainders[l])  # stable: ties to lower layer
    given, i = sum(quotas), 0
    while given < spare:
        quotas[order[i]] += 1
        i = (i + 1) % layers
        given += 1
    return [q + 1 for q in quotas]


def torch_decide(stat, groups, page_size, quotas, sinks=4, tau=0.5):
    """Page-EntroKV in plain eager PyTorch: entropy (alpha 2), weights, pooling, page max,
    top-K with ties to the lower page. Returns kept pages per (layer, group)."""
    layers, heads, tokens = stat.shape
    r = heads // groups
    pages = -(-tokens // page_size)
    pad = pages * page_size - tokens
    kept = []
    for layer in range(layers):
        s = stat[layer]
        rest = s[:, sinks:].double()
        total = rest.sum(dim=1)
        power = (rest * rest).sum(dim=1)
        entropy = torch.where(total > 0, -torch.log(power / (total * total) + EPS_LOG),
                              torch.full_like(total, math.log(max(tokens - sinks, 1))))
        for g in range(groups):
            h = entropy[g * r:(g + 1) * r]
            w = torch.exp(-(h - h.min()) / tau)
            w = (w / w.sum()).float()
            pooled = torch.zeros(tokens, dtype=torch.float32)
            for i in range(r):
                pooled = pooled + w[i] * s[g * r + i]
            if pad:
                pooled = torch.nn.functional.pad(pooled, (0, pad))
            scores = pooled.view(pages, page_size).amax(dim=1)
            order = torch.sort(scores, descending=True, stable=True).indices
            k = min(quotas[layer], pages)
            kept.append(torch.sort(order[:k]).values)
    return kept


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", required=True,
                        help="the command before `core`: 'build/client/cli/entrokv bench' or "
                             "build/bench/core/entrokv_bench_dev")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--query-heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--torch-runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    stat = seeded_statistic(args.seed, args.layers, args.query_heads, args.tokens)
    quotas = plan_budget(args.layers, args.kv_heads, args.page_size, args.tokens, args.budget)
    with tempfile.TemporaryDirectory() as tmp:
        npy = os.path.join(tmp, "stat.npy")
        kept_path = os.path.join(tmp, "kept.txt")
        np.save(npy, stat)
        command = shlex.split(args.runner) + ["core", "--input", npy, "--kv-heads", str(args.kv_heads),
                   "--page-size", str(args.page_size), "--budget", str(args.budget),
                   "--runs", str(args.runs), "--threads", "1", "--json",
                   "--kept-out", kept_path]
        ours = json.loads(subprocess.run(command, check=True, capture_output=True,
                                         text=True).stdout)
        with open(kept_path) as f:
            ours_kept = [[int(x) for x in line.split()] for line in f]

    tensor = torch.from_numpy(stat)
    torch_decide(tensor, args.kv_heads, args.page_size, quotas)  # warm-up
    times = []
    for _ in range(args.torch_runs):
        start = time.perf_counter()
        torch_kept = torch_decide(tensor, args.kv_heads, args.page_size, quotas)
        times.append((time.perf_counter() - start) * 1e3)
    torch_ms = float(np.median(times))
    same = sum(1 for a, b in zip(ours_kept, torch_kept) if a == b.tolist())
    cells = args.layers * args.kv_heads

    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "shape": {"layers": args.layers, "query_heads": args.query_heads,
                  "kv_heads": args.kv_heads, "tokens": args.tokens,
                  "page_size": args.page_size, "budget": args.budget, "dtype": "f32"},
        "ours_median_ms": ours["median_ms"], "ours_min_ms": ours["min_ms"],
        "read_once_ms": ours["read_once_ms"], "ours_over_read_once": ours["ratio_median"],
        "torch_median_ms": torch_ms, "torch_runs_ms": times,
        "torch_over_ours": torch_ms / ours["median_ms"],
        "same_pages_cells": same, "cells": cells,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    if same != cells:
        print(f"MISMATCH: {cells - same} of {cells} cells keep different pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
