#!/usr/bin/python3
"""What neighbourhood pooling costs a decision: the fused CPU path, one thread, at one shape,
for each kernel width and pooling against the same path without it (width 1), in rounds that
run every setting in turn so that all see the same machine. Writes the runs as JSON lines and a
markdown table of medians and ratios to width 1 within each round:

  /usr/bin/python3 bench/core/neighbourhood_cost.py --runner build/client/cli/entrokv \\
      --jsonl bench/results/neighbourhood_cost.jsonl --table bench/results/neighbourhood_cost.md
"""

import argparse
import json
import statistics
import subprocess

SETTINGS = [(1, "max"), (3, "max"), (7, "max"), (7, "mean"), (15, "max"), (15, "mean"),
            (63, "max"), (63, "mean")]


def run_once(args, kernel, pooling):
    command = [args.runner, "bench", "core", "--layers", str(args.layers), "--query-heads",
               str(args.query_heads), "--kv-heads", str(args.kv_heads), "--tokens",
               str(args.tokens), "--dtype", args.dtype, "--policy", args.policy, "--runs",
               str(args.runs), "--neighbourhood-kernel", str(kernel), "--neighbourhood",
               pooling, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", required=True, help="the entrokv CLI")
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per invocation")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--query-heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--policy", default="page_entrokv")
    args = parser.parse_args()

    rows = []
    with open(args.jsonl, "w") as out:
        for round_index in range(args.rounds):
            for kernel, pooling in SETTINGS:
                result = run_once(args, kernel, pooling)
                result["round"] = round_index
                rows.append(result)
                out.write(json.dumps(result) + "\n")
                print(f"round {round_index}: width {kernel} {pooling}: "
                      f"{result['median_ms']:.2f} ms", flush=True)

    base = {row["round"]: row["median_ms"] for row in rows
            if row["neighbourhood_kernel"] == "1"}
    lines = [f"{args.policy}, {args.layers} layers x {args.query_heads} query heads / "
             f"{args.kv_heads} KV heads, T = {args.tokens}, {args.dtype}, one thread; "
             f"{args.rounds} rounds of {args.runs} runs each",
             "",
             "| width | pooling | median ms | x width 1 (median of rounds) |",
             "| ---: | --- | ---: | ---: |"]
    for kernel, pooling in SETTINGS:
        mine = [row for row in rows if row["neighbourhood_kernel"] == str(kernel)
                and row["neighbourhood"] == pooling]
        ms = statistics.median(row["median_ms"] for row in mine)
        ratio = statistics.median(row["median_ms"] / base[row["round"]] for row in mine)
        label = "off" if kernel == 1 else pooling
        lines.append(f"| {kernel} | {label} | {ms:.2f} | {ratio:.2f} |")
    with open(args.table, "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
