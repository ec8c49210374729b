#!/usr/bin/python3
"""Draws the PNGs of an `entrokv eval` output directory from its CSV files.

Usage: /usr/bin/python3 sim/plots/eval_plots.py --out DIR
Reads results.csv, uor_groups.csv, heads.csv and scope.csv in DIR and writes uor.png,
needle.png, mass.png, page_size.png, masquerade.png and scope.png beside them. Needs matplotlib (Debian
python3-matplotlib); exits non-zero when it cannot draw.
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_STYLE = {
    "page_entrokv": ("tab:red", "o", 2.6),
    "raw_entropy": ("tab:orange", "v", 1.4),
    "mean": ("tab:blue", "s", 1.4),
    "max": ("tab:purple", "^", 1.4),
    "head_independent": ("tab:gray", "x", 1.4),
    "snapkv": ("tab:green", "D", 1.4),
    "h2o": ("tab:brown", "P", 1.4),
    "streaming": ("black", "*", 1.4),
}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def style(policy):
    return POLICY_STYLE.get(policy, ("tab:olive", ".", 1.2))


def reference_page(rows):
    sizes = sorted({int(r["page_size"]) for r in rows})
    return 16 if 16 in sizes else sizes[0]


def policies_of(rows):
    seen = []
    for r in rows:
        if r["policy"] not in seen:
            seen.append(r["policy"])
    return seen


def series(rows, policy, page, field):
    pts = sorted((float(r["budget"]), float(r[field])) for r in rows
                 if r["policy"] == policy and int(r["page_size"]) == page)
    return [p[0] * 100 for p in pts], [p[1] for p in pts]


def title(rows):
    return f"{rows[0]['model']}, T = {rows[0]['tokens']}"


def plot_uor(rows, groups, out):
    page = reference_page(rows)
    budgets = sorted({float(r["budget"]) for r in rows})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 6.5))
    data = [[float(g["uor"]) for g in groups
             if float(g["budget"]) == b and int(g["page_size"]) == page] for b in budgets]
    pos = list(range(len(budgets)))
    if any(data):
        ax.boxplot(data, positions=pos, widths=0.5, showfliers=True,
                   flierprops={"markersize": 3, "alpha": 0.4})
    hi = {float(r["budget"]): r for r in rows
          if r["policy"] == "head_independent" and int(r["page_size"]) == page}
    if hi:
        ax.plot(pos, [float(hi[b]["uor_mean"]) for b in budgets], "o-", color="tab:gray",
                label="head_independent: mean (measured)")
        ax.plot(pos, [float(hi[b]["uor_max"]) for b in budgets], "x--", color="tab:gray",
                label="head_independent: max")
        ax.plot(pos, [float(hi[b]["sandwich_upper_mean"]) for b in budgets], ":",
                color="tab:purple", label="sandwich upper bound (mean)")
        ax.plot(pos, [float(hi[b]["sandwich_lower_mean"]) for b in budgets], "-.",
                color="tab:purple", label="sandwich (Cauchy-Schwarz) lower bound (mean)")
        ax.plot(pos, [float(hi[b]["bonferroni_mean"]) for b in budgets], "--",
                color="tab:cyan", label="Bonferroni lower bound (mean)")
    pooled = [p for p in policies_of(rows) if p != "head_independent"]
    if pooled:
        worst = [max(float(r["uor_max"]) for r in rows if r["policy"] in pooled
                     and float(r["budget"]) == b and int(r["page_size"]) == page)
                 for b in budgets]
        ax.plot(pos, worst, "s-", color="tab:red", linewidth=2.5,
                label=f"pooled policies: max measured UOR ({len(pooled)} policies)")
    ax.set_xticks(pos, [f"{b * 100:g}%" for b in budgets])
    ax.set_xlabel("budget (share of the sequence)")
    ax.set_ylabel("UOR = |kept pages| / K per (layer, group)")
    ax.set_title(f"Union overhead, B = {page} ({title(rows)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    for size in sorted({int(r["page_size"]) for r in rows}):
        x, y = series(rows, "head_independent", size, "uor_mean")
        if x:
            ax2.plot(x, y, "o-", label=f"B = {size}")
    ax2.axhline(1.0, color="tab:red", linewidth=2, label="pooled (measured 1.000)")
    ax2.set_xscale("log")
    ax2.set_xticks([b * 100 for b in budgets], [f"{b * 100:g}%" for b in budgets])
    ax2.set_xlabel("budget")
    ax2.set_ylabel("head_independent mean UOR")
    ax2.set_title("Union overhead by page size")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "uor.png"), dpi=110)
    plt.close(fig)


def plot_policy_lines(rows, out, name, panels, suptitle):
    page = reference_page(rows)
    budgets = sorted({float(r["budget"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    for ax, (field, ylabel) in zip(axes[0], panels):
        for policy in policies_of(rows):
            color, marker, width = style(policy)
            x, y = series(rows, policy, page, field)
            ls = ":" if policy == "head_independent" else "-"
            label = policy + (" (> budget)" if policy == "head_independent" else "")
            ax.plot(x, y, marker=marker, color=color, linewidth=width, linestyle=ls, label=label)
        ax.set_xscale("log")
        ax.set_xticks([b * 100 for b in budgets], [f"{b * 100:g}%" for b in budgets])
        ax.set_xlabel("budget (share of the sequence)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{suptitle}, B = {page} ({title(rows)})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)


def plot_page_size(rows, out):
    budgets = sorted({float(r["budget"]) for r in rows})
    budget = 0.1 if 0.1 in budgets else budgets[len(budgets) // 2]
    sizes = sorted({int(r["page_size"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, (field, ylabel) in zip(axes, [("retained_mass", "retained attention mass"),
                                          ("needle_target_rate", "needle targets kept")]):
        for policy in policies_of(rows):
            color, marker, width = style(policy)
            pts = sorted((int(r["page_size"]), float(r[field])) for r in rows
                         if r["policy"] == policy and float(r["budget"]) == budget)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                    linewidth=width, linestyle=":" if policy == "head_independent" else "-",
                    label=policy)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("page size B (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Page size at a {budget * 100:g}% budget ({title(rows)})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "page_size.png"), dpi=110)
    plt.close(fig)


def plot_masquerade(rows, heads, out):
    value = {(h["analysis"], h["x"], h["variant"], h["metric"]): float(h["value"])
             for h in heads}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    ax = axes[0]
    classes = ["sink", "retrieval", "other"]
    width = 0.2
    for i, (analysis, variant, color, label) in enumerate([
            ("class_weight", "raw", "tab:orange", "all groups, raw H2"),
            ("class_weight", "isolated", "tab:red", "all groups, sink-isolated H2"),
            ("mixed_group_weight", "raw", "moccasin", "mixed groups, raw H2"),
            ("mixed_group_weight", "isolated", "salmon", "mixed groups, sink-isolated H2")]):
        ys = [value.get((analysis, c, variant, "mean_weight"), 0.0) for c in classes]
        ax.bar([k + (i - 1.5) * width for k in range(len(classes))], ys, width, color=color,
               label=label, edgecolor="black", linewidth=0.5)
    ax.set_xticks(range(len(classes)), classes)
    tallest = max([v for k, v in value.items() if k[3] == "mean_weight"] + [0.1])
    ax.set_ylim(0, tallest * 1.5)
    ax.set_ylabel("mean head weight in its group")
    ax.set_title("Sink heads vs retrieval heads")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="y")

    for ax, analysis, xlabel in [(axes[1], "tau_sweep", "temperature tau"),
                                 (axes[2], "alpha_sweep", "Renyi order alpha")]:
        xs = []
        for h in heads:
            if h["analysis"] == analysis and h["x"] not in xs:
                xs.append(h["x"])
        pos = list(range(len(xs)))
        for variant, color in [("raw", "tab:orange"), ("isolated", "tab:red")]:
            ax.plot(pos, [value.get((analysis, x, variant, "max_weight_mean"), 0.0) for x in xs],
                    "o-", color=color, label=f"max weight, {variant}")
            if analysis == "alpha_sweep":
                ax.plot(pos, [value.get((analysis, x, variant, "retrieval_weight_mixed"), 0.0)
                              for x in xs], "s--", color=color,
                        label=f"retrieval head weight (mixed groups), {variant}")
        ax.set_xticks(pos, xs)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("weight")
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Largest head weight in a group, mean over groups" if analysis == "tau_sweep"
                     else "Order sweep at the evaluated tau")
    fig.suptitle(f"Sink masquerade ({title(rows)})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "masquerade.png"), dpi=110)
    plt.close(fig)


SCOPE_STYLE = {"mass_max": "-", "entropy_weighted": "--", "mass_mean": "-.", "-": ":"}


def plot_scope(rows, out):
    """Selection scope in the LAYER layout: frames kept per planned, retained mass and needle
    targets per budget, one line per (policy, scope, combine)."""
    fig, axes = plt.subplots(1, 3, figsize=(19.5, 5), squeeze=False)
    if not rows:
        axes[0][0].text(0.5, 0.5, "no scope analysis in this run", ha="center")
        fig.savefig(os.path.join(out, "scope.png"), dpi=110)
        plt.close(fig)
        return
    variants = []
    for r in rows:
        key = (r["policy"], r["scope"], r["combine"])
        if key not in variants:
            variants.append(key)
    budgets = sorted({float(r["budget"]) for r in rows})
    panels = [("frames", "frames kept / planned (LAYER layout)"),
              ("retained_mass", "retained attention mass (group mean, LAST_ROW)"),
              ("needle_target_rate", "share of (needle, layer, group) targets kept")]
    for ax, (field, ylabel) in zip(axes[0], panels):
        for policy, scope, combine in variants:
            pts = []
            for r in rows:
                if (r["policy"], r["scope"], r["combine"]) != (policy, scope, combine):
                    continue
                value = (int(r["kept_frames"]) / max(int(r["planned_frames"]), 1)
                         if field == "frames" else float(r[field]))
                pts.append((float(r["budget"]) * 100, value))
            pts.sort()
            color, marker, width = style(policy)
            label = f"{policy} {scope}" + (f" {combine}" if combine != "-" else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                    linewidth=width if scope == "layer" else 1.2,
                    linestyle=SCOPE_STYLE.get(combine, ":") if scope == "layer" else ":",
                    alpha=1.0 if scope == "layer" else 0.6, label=label)
        ax.set_xscale("log")
        ax.set_xticks([b * 100 for b in budgets], [f"{b * 100:g}%" for b in budgets])
        ax.set_xlabel("budget (share of the sequence)")
        ax.set_ylabel(ylabel)
        if field != "frames":
            ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Selection scope in the LAYER frame layout, B = {rows[0]['page_size']} "
                 f"({title(rows)})")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scope.png"), dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="the eval output directory")
    args = parser.parse_args()
    rows = read_csv(os.path.join(args.out, "results.csv"))
    if not rows:
        print("eval_plots: results.csv has no rows", file=sys.stderr)
        return 1
    groups = read_csv(os.path.join(args.out, "uor_groups.csv"))
    heads = read_csv(os.path.join(args.out, "heads.csv"))
    plot_uor(rows, groups, args.out)
    plot_policy_lines(rows, args.out, "needle.png",
                      [("needle_target_rate", "share of (needle, layer, group) targets kept"),
                       ("needle_all_targets", "share of needles kept at every target")],
                      "Needle retention")
    plot_policy_lines(rows, args.out, "mass.png",
                      [("retained_mass", "retained attention mass (group mean, LAST_ROW)")],
                      "Retained attention mass")
    plot_page_size(rows, args.out)
    plot_masquerade(rows, heads, args.out)
    scope_path = os.path.join(args.out, "scope.csv")
    plot_scope(read_csv(scope_path) if os.path.exists(scope_path) else [], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
