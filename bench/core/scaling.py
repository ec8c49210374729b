#!/usr/bin/python3
"""Scaling run of the fused CPU core: T from 4,096 to 524,288 for the model shapes of
docs/architecture.md §7, one thread, beside the read-once floor measured in the same process.

Writes a CSV and a PNG plot (Debian python3-matplotlib; run with /usr/bin/python3):

  /usr/bin/python3 bench/core/scaling.py --runner build/bench/core/entrokv_bench_dev \
      --csv bench/results/core_scaling.csv --png bench/results/core_scaling.png

A whole-model statistic above --max-bytes in float32 is run in bfloat16 instead (half the
bytes); above --max-bytes in bfloat16 too the size is skipped and listed as skipped.
"""

import argparse
import csv
import json
import subprocess
import sys

SHAPES = [  # name, layers, query heads, KV heads (sim/presets.cc)
    ("qwen2.5-1.5b", 28, 12, 2),
    ("llama3.1-8b", 32, 32, 8),
    ("llama3-70b", 80, 64, 8),
]
TOKENS = [4096, 16384, 65536, 131072, 262144, 524288]
FIELDS = ["shape", "layers", "query_heads", "kv_heads", "tokens", "dtype", "bytes", "median_ms",
          "min_ms", "read_once_ms", "ratio_median", "ns_per_element", "status"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--png")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-bytes", type=float, default=3.0e9)
    args = parser.parse_args()

    rows = []
    for name, layers, heads, groups in SHAPES:
        for tokens in TOKENS:
            elements = layers * heads * tokens
            dtype = "f32" if elements * 4 <= args.max_bytes else "bf16"
            row = {"shape": name, "layers": layers, "query_heads": heads, "kv_heads": groups,
                   "tokens": tokens, "dtype": dtype}
            if elements * 2 > args.max_bytes:
                row.update(status="skipped: above --max-bytes in bf16", bytes=elements * 2)
                rows.append(row)
                print(f"{name} T={tokens}: skipped", file=sys.stderr)
                continue
            command = [args.runner, "core", "--layers", str(layers), "--query-heads", str(heads),
                       "--kv-heads", str(groups), "--tokens", str(tokens), "--dtype", dtype,
                       "--runs", str(args.runs), "--threads", "1", "--json"]
            result = json.loads(subprocess.run(command, check=True, capture_output=True,
                                               text=True).stdout)
            row.update({k: result[k] for k in ("bytes", "median_ms", "min_ms", "read_once_ms",
                                               "ratio_median")})
            row["ns_per_element"] = result["median_ms"] * 1e6 / elements
            row["status"] = "ok"
            rows.append(row)
            print(f"{name} T={tokens} {dtype}: {result['median_ms']:.2f} ms, read once "
                  f"{result['read_once_ms']:.2f} ms, x{result['ratio_median']:.2f}",
                  file=sys.stderr)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)

    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for (name, *_), color in zip(SHAPES, ["C0", "C1", "C2"]):
            done = [r for r in rows if r["shape"] == name and r["status"] == "ok"]
            t = [r["tokens"] for r in done]
            ax.plot(t, [r["median_ms"] for r in done], "o-", color=color,
                    label=f"{name} fused (1 thread)")
            ax.plot(t, [r["read_once_ms"] for r in done], "s--", color=color, alpha=0.6,
                    label=f"{name} read once")
            for r in done:
                if r["dtype"] != "f32":
                    ax.annotate(r["dtype"], (r["tokens"], r["median_ms"]), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel("whole-model decision time (ms)")
        ax.set_title("entrokv fused CPU scoring vs the read-once floor")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
