#!/usr/bin/python3
"""What neighbourhood pooling costs a decision: the fused CPU path, one thread, at one shape,
for each kernel width and pooling against the same path without it (width 1), in rounds that
run every setting in turn so that all see the same machine (option_cost.py). Writes the runs as
JSON lines and a markdown table of medians and ratios to width 1 within each round:

  /usr/bin/python3 bench/core/neighbourhood_cost.py --runner build/client/cli/entrokv \\
      --jsonl bench/results/neighbourhood_cost.jsonl --table bench/results/neighbourhood_cost.md
"""

import option_cost

SETTINGS = [(1, "max"), (3, "max"), (7, "max"), (7, "mean"), (15, "max"), (15, "mean"),
            (63, "max"), (63, "mean")]


def main():
    args = option_cost.shape_parser(__doc__).parse_args()
    settings = [(f"{kernel} {pooling}",
                 ["--neighbourhood-kernel", str(kernel), "--neighbourhood", pooling])
                for kernel, pooling in SETTINGS]
    rows = option_cost.run_rounds(args, settings)
    lines = [option_cost.headline(args), "",
             "| width | pooling | median ms | x width 1 (median of rounds) |",
             "| ---: | --- | ---: | ---: |"]
    measured = option_cost.medians(rows, [label for label, _ in settings])
    for (kernel, pooling), (ms, ratio) in zip(SETTINGS, measured.values()):
        label = "off" if kernel == 1 else pooling
        lines.append(f"| {kernel} | {label} | {ms:.2f} | {ratio:.2f} |")
    with open(args.table, "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
