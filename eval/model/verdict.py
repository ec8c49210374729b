"""The goal a default policy is held to, checked on a report's rows (verdict.md, verdict.png).

In every (task, length, ratio) cell of the main pass (GROUP layout, page size 16):
- the reference must not be significantly behind (exact McNemar p < 0.05 on the same prompts) any
  policy that keeps the same frames or fewer (its mean over the cell's prompts);
- it should be significantly ahead of the anchor (snapkv) in at least a quarter of the cells;
- it must keep exactly its budget: the anchor keeps exactly K pages per group, so the reference
  is held to the anchor's frames, prompt by prompt.

evaluate.summarize writes both files from the paired comparisons it already made, and
standings.md: every policy held to the same goal in turn, which shows whether any policy of the
report would have met it.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Dict, List, Sequence

import numpy as np

import tasks

ALPHA = 0.05
MAIN = (16, "group")  # (page size, layout) of the main pass


def format_p(p: float) -> str:
    """A McNemar p as the reports print it."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def holm_threshold(p_values: Sequence[float]) -> float:
    """The largest p that Holm's step-down procedure rejects at ALPHA over these comparisons
    (-1 when it rejects none): the i-th smallest p is held to ALPHA / (m - i + 1), and the first
    that fails stops it."""
    threshold = -1.0
    for i, p in enumerate(sorted(p_values)):
        if p >= ALPHA / (len(p_values) - i):
            break
        threshold = p
    return threshold


def _cell(row) -> tuple:
    return (row["task"], int(row["length"]), float(row["ratio"]))


def _order(cells) -> List[tuple]:
    return sorted(cells, key=lambda c: (tasks.TASKS.index(c[0]), c[1], c[2]))


def check(rows: Sequence[dict], pairs: Sequence[dict], reference: str,
          anchor: str = "snapkv") -> Dict[str, object]:
    """The goal's three parts from results.csv's rows and evaluate.comparisons' pairs."""
    main = [r for r in rows if (int(r["page_size"]), r["layout"]) == MAIN and r["policy"] != "none"]
    frames: Dict[tuple, Dict[str, Dict[int, int]]] = {}
    for r in main:
        frames.setdefault(_cell(r), {}).setdefault(r["policy"], {})[int(r["prompt"])] = int(
            r["kept_frames"])
    cells = _order(c for c in frames if reference in frames[c])
    mean_frames = {(c, p): float(np.mean(list(v.values()))) for c in cells
                   for p, v in frames[c].items()}
    by = {(p["task"], int(p["length"]), float(p["ratio"]), p["policy"]): p for p in pairs
          if (int(p["page_size"]), p["layout"]) == MAIN and p["reference"] == reference}

    behind, ahead, larger, held = [], [], set(), []
    for c in cells:
        for policy in sorted(set(frames[c]) - {reference}):
            pair = by.get(c + (policy,))
            if pair is None:
                continue
            significant = pair["p"] < ALPHA
            if mean_frames[(c, policy)] > mean_frames[(c, reference)] + 1e-9:
                larger.add(policy)
            else:
                held.append(pair["p"])
                if significant and pair["worse"] > pair["better"]:
                    behind.append((c, pair))
            if policy == anchor and significant and pair["better"] > pair["worse"]:
                ahead.append(c)

    mine, theirs = {}, {}
    for c in cells:
        for prompt, kept in frames[c].get(anchor, {}).items():
            if prompt in frames[c][reference]:
                mine[(c, prompt)], theirs[(c, prompt)] = frames[c][reference][prompt], kept
    differ = [k for k in mine if mine[k] != theirs[k]]
    threshold = holm_threshold(held)
    return dict(reference=reference, anchor=anchor, cells=cells, behind=behind, ahead=ahead,
                comparisons=len(held),
                behind_corrected=[(c, pair) for c, pair in behind if pair["p"] <= threshold],
                larger=sorted(larger), frames_compared=len(mine), frames_differ=len(differ),
                frames_max_difference=max((abs(mine[k] - theirs[k]) for k in differ), default=0),
                pairs=by)


def markdown(result: Dict[str, object]) -> str:
    reference, anchor, cells = result["reference"], result["anchor"], result["cells"]
    behind, ahead = result["behind"], result["ahead"]
    quarter = math.ceil(len(cells) / 4)
    behind_cells = _order({c for c, _ in behind})
    out = [f"# The goal, checked for {reference}\n",
           f"Main pass (page size 16, GROUP layout), {len(cells)} (task, length, ratio) cells; "
           f"significant: exact McNemar p < {ALPHA} on the same prompts.\n",
           f"- **Behind a policy that keeps the same frames or fewer:** in {len(behind_cells)} of "
           f"{len(cells)} cells ({'met' if not behind else 'not met'}). Corrected for the "
           f"{result['comparisons']} comparisons it is held to (Holm): in "
           f"{len({c for c, _ in result['behind_corrected']})} of {len(cells)} cells.",
           f"- **Ahead of {anchor}:** in {len(ahead)} of {len(cells)} cells (a quarter is "
           f"{quarter}: {'met' if len(ahead) >= quarter else 'not met'}).",
           f"- **Frames kept:** {reference} kept exactly {anchor}'s frames on "
           f"{result['frames_compared'] - result['frames_differ']} of "
           f"{result['frames_compared']} prompts"
           + (f" (at most {result['frames_max_difference']} apart)." if result["frames_differ"]
              else ".")]
    if result["larger"]:
        out.append(f"- Not held to it (they keep more frames than {reference} on average in some "
                   f"cell): {', '.join(result['larger'])}.")
    if behind:
        out += ["", "| cell | ahead of " + reference + " | "
                f"+{reference} / -other (p) |", "|---|---|---|"]
        for c, pair in sorted(behind, key=lambda b: (tasks.TASKS.index(b[0][0]),) + b[0][1:]):
            out.append(f"| {_label(c)} | {pair['policy']} | +{pair['better']} / -{pair['worse']} "
                       f"({format_p(pair['p'])}) |")
    return "\n".join(out) + "\n"


def _label(c) -> str:
    task, length, ratio = c
    return f"{task} {length // 1024}K {ratio:g}"


def plot(result: Dict[str, object], path: str) -> None:
    """Every other policy (rows) against the reference in every cell (columns): green where the
    reference is ahead, red where behind, dark where p < 0.05; hatched rows keep more frames."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, by, reference = result["cells"], result["pairs"], result["reference"]
    policies = sorted({k[3] for k in by})
    grid = np.full((len(policies), len(cells)), np.nan)
    for i, policy in enumerate(policies):
        for j, c in enumerate(cells):
            pair = by.get(c + (policy,))
            if pair is None:
                continue
            sign = np.sign(pair["better"] - pair["worse"])
            grid[i, j] = sign * (2 if pair["p"] < ALPHA else 1)
    fig, ax = plt.subplots(figsize=(max(8, 0.28 * len(cells) + 3), 0.42 * len(policies) + 2.2))
    ax.imshow(grid, cmap="RdYlGn", vmin=-2.4, vmax=2.4, aspect="auto")
    ax.set_xticks(range(len(cells)), [_label(c) for c in cells], rotation=90, fontsize=7)
    ax.set_yticks(range(len(policies)), [p + (" (more frames)" if p in result["larger"] else "")
                                         for p in policies], fontsize=8)
    ax.set_title(f"{reference} against each policy, paired on the same prompts\n"
                 "dark green / red: significantly ahead / behind (p < 0.05); light: not "
                 "significant; yellow: level", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out_dir: str, rows: Sequence[dict], pairs: Sequence[dict], reference: str,
          anchor: str = "snapkv") -> Dict[str, object]:
    result = check(rows, pairs, reference, anchor)
    if not result["cells"] or reference == anchor:
        return result
    with open(os.path.join(out_dir, "verdict.md"), "w") as f:
        f.write(markdown(result))
    plot(result, os.path.join(out_dir, "verdict.png"))
    return result


def standings(rows: Sequence[dict], pairs_of: Callable[[str], Sequence[dict]],
              policies: Sequence[str], anchor: str = "snapkv") -> str:
    """standings.md: each policy as the reference (pairs_of(policy): its paired comparisons),
    the cells it is significantly behind a policy with the same frames or fewer in, those left
    after Holm's correction, and the cells it is significantly ahead of the anchor in."""
    lines = ["# Every policy held to the goal", "",
             "Each policy in turn as the reference (`verdict.md` does it for the report's "
             f"`--reference`): the cells it is behind a policy that keeps the same frames or "
             f"fewer in (p < {ALPHA}, and after Holm's correction), and the cells it is ahead of "
             f"{anchor} in. Main pass (page size 16, GROUP layout).", "",
             f"| policy | cells | behind | behind after Holm | ahead of {anchor} | cells behind |",
             "|---|---|---|---|---|---|"]
    for policy in policies:
        result = check(rows, pairs_of(policy), policy, anchor)
        if not result["cells"]:
            continue
        behind = _order({c for c, _ in result["behind"]})
        corrected = {c for c, _ in result["behind_corrected"]}
        ahead = "-" if policy == anchor else str(len(result["ahead"]))
        named = ", ".join(_label(c) + (" (Holm)" if c in corrected else "") for c in behind)
        lines.append(f"| {policy} | {len(result['cells'])} | {len(behind)} | {len(corrected)} | "
                     f"{ahead} | {named or '-'} |")
    return "\n".join(lines) + "\n"
