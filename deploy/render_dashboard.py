#!/usr/bin/env python3
"""Draws the Grafana dashboard's panels (deploy/grafana/entrokv.json) from a real Prometheus.

Grafana is not installable on the build machines, so this stands in for a screenshot: each
panel's PromQL is queried over a time range through Prometheus' HTTP API and drawn with
matplotlib at the panel's gridPos (24 columns, like Grafana), time series as lines, the heatmap
as per-bucket rates, the stat as its last value. tests/deploy/prometheus_e2e_test.py --render
calls render() against the Prometheus it started.
"""

import json
import math
import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

DASHBOARD = pathlib.Path(__file__).resolve().parent / "grafana" / "entrokv.json"
# The rate window Grafana would pick for a 1 s scrape interval and a 1 s step.
RATE_INTERVAL = "5s"
ROW_HEIGHT_IN = 0.36  # inches per grid unit of height
WIDTH_IN = 20.0


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def format_axis(ax, unit):
    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit == "s":
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _: f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"))
    elif unit == "Bps":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2**20:.3g} MiB/s"))
    elif unit in ("ops", "reqps"):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}/s"))


def query_panel(api, panel, start, end):
    """[(legend, [t], [v])] for every series of every target of the panel."""
    series = []
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$pool", ".*")
        result = api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        if result["status"] != "success":
            raise RuntimeError(f"{panel['title']}: {result.get('error')}")
        for s in result["data"]["result"]:
            points = [(float(t) - start, float(v)) for t, v in s["values"]]
            series.append((legend(target.get("legendFormat", ""), s["metric"]),
                           [t for t, _ in points], [v for _, v in points]))
    return series


def draw_timeseries(ax, panel, series):
    for name, times, values in sorted(series):
        if any(math.isfinite(v) and v != 0 for v in values):
            ax.plot(times, values, linewidth=1.2, label=name)
    format_axis(ax, panel["fieldConfig"]["defaults"].get("unit"))
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=6, loc="upper left", ncol=2 if len(handles) > 4 else 1,
                  framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "all series 0", transform=ax.transAxes, ha="center", color="grey")
    ax.set_xlabel("seconds", fontsize=7)


def draw_heatmap(ax, series):
    """Cumulative bucket rates per `le` -> the rate inside each bucket, over time."""
    buckets = sorted(series, key=lambda s: float(s[0]))
    if not buckets:
        return
    times = buckets[0][1]
    rows, previous = [], [0.0] * len(times)
    for _, _, values in buckets:
        rows.append([max(0.0, v - p) if math.isfinite(v) else 0.0
                     for v, p in zip(values, previous)])
        previous = [v if math.isfinite(v) else 0.0 for v in values]
    image = ax.imshow(rows, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest",
                      extent=(times[0], times[-1], 0, len(rows)))
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels([f"<= {b[0]}" for b in buckets], fontsize=6)
    ax.set_xlabel("seconds", fontsize=7)
    plt.colorbar(image, ax=ax, pad=0.01).set_label("groups/s", fontsize=7)


def draw_stat(ax, series):
    last = [v for _, _, values in series for v in values[-1:] if math.isfinite(v)]
    ax.text(0.5, 0.45, f"{sum(last):g}" if last else "-", transform=ax.transAxes,
            ha="center", va="center", fontsize=40, color="tab:green")
    ax.set_xticks([])
    ax.set_yticks([])


def render(api, start, end, path):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(WIDTH_IN, height_units * ROW_HEIGHT_IN + 0.8))
    top = 1 - 0.8 / fig.get_figheight()
    fig.suptitle(f"{dashboard['title']} (uid {dashboard['uid']}): every panel drawn from a real "
                 f"Prometheus scraping entrokvd under `entrokv replay`; pool = All",
                 fontsize=12, y=1 - 0.25 / fig.get_figheight())
    for panel in panels:
        grid = panel["gridPos"]
        left, width = grid["x"] / 24, grid["w"] / 24
        bottom = top - (grid["y"] + grid["h"]) / height_units * top
        height = grid["h"] / height_units * top
        if panel["type"] == "row":
            fig.text(0.005, bottom + height / 2, panel["title"], fontsize=11, fontweight="bold",
                     va="center")
            continue
        ax = fig.add_axes((left + 0.035, bottom + 0.2 * height, width - 0.05, height * 0.66))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        series = query_panel(api, panel, start, end)
        if panel["type"] == "heatmap":
            draw_heatmap(ax, series)
        elif panel["type"] == "stat":
            draw_stat(ax, series)
        else:
            draw_timeseries(ax, panel, series)
    fig.savefig(path, dpi=80)
    plt.close(fig)
