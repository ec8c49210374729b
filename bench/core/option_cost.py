#!/usr/bin/python3
"""What a scoring option costs a decision: `entrokv bench core` (the fused CPU path, one thread,
one shape) for each setting of the option against the first setting, in rounds that run every
setting in turn so that all see the same machine. Writes the runs as JSON lines and a markdown
table of medians and ratios to the first setting within each round, e.g. the group floor:

  /usr/bin/python3 bench/core/option_cost.py --runner build/client/cli/entrokv \\
      --jsonl bench/results/group_quotas/cost.jsonl --table bench/results/group_quotas/cost.md \\
      --setting "fixed quotas=--group-floor 1" --setting "floor 0.25=--group-floor 0.25" \\
      --setting "floor 0=--group-floor 0"
"""

import argparse
import json
import shlex
import statistics
import subprocess


def shape_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every option's cost takes: the CLI, the outputs, the rounds and the shape."""
    parser = argparse.ArgumentParser(description=description,
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
    return parser


def run_rounds(args, settings):
    """Every (label, flags) setting once per round, in turn: the bench's JSON with the round and
    the label added, also written to args.jsonl as it arrives."""
    rows = []
    with open(args.jsonl, "w") as out:
        for round_index in range(args.rounds):
            for label, flags in settings:
                command = [args.runner, "bench", "core", "--layers", str(args.layers),
                           "--query-heads", str(args.query_heads), "--kv-heads",
                           str(args.kv_heads), "--tokens", str(args.tokens), "--dtype",
                           args.dtype, "--policy", args.policy, "--runs", str(args.runs),
                           "--json", *flags]
                done = subprocess.run(command, capture_output=True, text=True, check=True,
                                      timeout=600)
                result = json.loads(done.stdout)
                result.update(round=round_index, setting=label)
                rows.append(result)
                out.write(json.dumps(result) + "\n")
                print(f"round {round_index}: {label}: {result['median_ms']:.2f} ms", flush=True)
    return rows


def medians(rows, labels):
    """Per label: the median of its rounds' medians (ms) and of its ratios to the first label's
    run in the same round."""
    base = {row["round"]: row["median_ms"] for row in rows if row["setting"] == labels[0]}
    out = {}
    for label in labels:
        mine = [row for row in rows if row["setting"] == label]
        out[label] = (statistics.median(row["median_ms"] for row in mine),
                      statistics.median(row["median_ms"] / base[row["round"]] for row in mine))
    return out


def headline(args) -> str:
    return (f"{args.policy}, {args.layers} layers x {args.query_heads} query heads / "
            f"{args.kv_heads} KV heads, T = {args.tokens}, {args.dtype}, one thread; "
            f"{args.rounds} rounds of {args.runs} runs each")


def main():
    parser = shape_parser(__doc__)
    parser.add_argument("--setting", action="append", required=True,
                        help="LABEL=FLAGS, the flags `entrokv bench core` gets; the first is "
                             "the baseline")
    args = parser.parse_args()
    settings = []
    for text in args.setting:
        label, _, flags = text.partition("=")
        settings.append((label, shlex.split(flags)))
    rows = run_rounds(args, settings)
    labels = [label for label, _ in settings]
    lines = [headline(args), "", f"| setting | median ms | x {labels[0]} (median of rounds) |",
             "| --- | ---: | ---: |"]
    for label, (ms, ratio) in medians(rows, labels).items():
        lines.append(f"| {label} | {ms:.2f} | {ratio:.2f} |")
    with open(args.table, "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
