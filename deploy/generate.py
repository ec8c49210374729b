#!/usr/bin/env python3
"""Generates the deployment files that must not drift from their sources.

  deploy/grafana/entrokv.json                       the Grafana dashboard (PANELS below)
  deploy/k8s/monitoring/rules/prometheusrule.yaml   deploy/prometheus/entrokv.rules.yml as a
                                                    Prometheus Operator PrometheusRule

`generate.py` rewrites both; `generate.py --check` exits 1 when a committed file differs from
what it would write (a test runs that). The dashboard's PromQL lives only here, so every panel
uses the same job selector, pool variable and `$__rate_interval`.
"""

import argparse
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent
DASHBOARD = ROOT / "grafana" / "entrokv.json"
RULES = ROOT / "prometheus" / "entrokv.rules.yml"
PROMETHEUS_RULE = ROOT / "k8s" / "monitoring" / "rules" / "prometheusrule.yaml"

DASHBOARD_UID = "entrokv-overview"
JOB = 'job="entrokv"'
POOL = 'pool=~"$pool"'
RATE = "[$__rate_interval]"


def rate(metric, *matchers):
    return f"rate({metric}{{{', '.join((JOB,) + matchers)}}}{RATE})"


def quantile(q, metric, by, *matchers):
    return f"histogram_quantile({q}, sum by ({by}, le) ({rate(metric + '_bucket', *matchers)}))"


def mean(metric, by, *matchers):
    return (f"sum by ({by}) ({rate(metric + '_sum', *matchers)})"
            f" / sum by ({by}) ({rate(metric + '_count', *matchers)})")


# One entry per panel: (row, title, kind, unit, [(expr, legend)], description). Rows are laid
# out top to bottom, panels two per line (a heatmap or a "wide" panel takes the whole line).
PANELS = [
    ("Pools", "Pool occupancy", "timeseries", "percentunit",
     [(f'sum by (instance, pool) (entrokv_pool_frames{{{JOB}, state="used", {POOL}}})'
       f' / sum by (instance, pool) (entrokv_pool_frames{{{JOB}, {POOL}}})',
       "{{pool}} {{instance}}")],
     "Used frames / all frames per pool. EntrokvPoolNearlyFull fires above 95% for 5 minutes."),
    ("Pools", "Frames used and free", "timeseries", "short",
     [(f"sum by (pool, state) (entrokv_pool_frames{{{JOB}, {POOL}}})", "{{pool}} {{state}}")],
     "Frames by state; used + free is the pool's capacity in frames."),
    ("Pools", "Active sequences", "timeseries", "short",
     [(f"sum by (pool) (entrokv_sequences_active{{{JOB}, {POOL}}})", "{{pool}}")],
     "Open sequences per pool (opened and not yet closed)."),
    ("Pools", "Statistics bytes/s", "timeseries", "Bps",
     [(f"sum by (source) ({rate('entrokv_stats_bytes_total')})", "{{source}}")],
     "Attention-statistic bytes received, as message bytes or by shared-memory reference."),
    ("Pressure", "Occupancy against target", "timeseries", "percentunit",
     [(f'sum by (instance, pool) (entrokv_pool_frames{{{JOB}, state="used", {POOL}}})'
       f' / sum by (instance, pool) (entrokv_pool_frames{{{JOB}, {POOL}}})',
       "used {{pool}} {{instance}}"),
      (f"max by (instance, pool) (entrokv_pool_target_occupancy{{{JOB}, {POOL}}})",
       "target {{pool}} {{instance}}")],
     "Used frames per capacity against --target_occupancy: above it the daemon sets quotas on "
     "sequences with server-chosen budgets, applied at their owners' next calls."),
    ("Pressure", "Frames reclaimed/s by reason", "timeseries", "ops",
     [(f"sum by (reason) ({rate('entrokv_frames_reclaimed_total', POOL)})", "{{reason}}")],
     "Frames quotas took from sequences with server-chosen budgets: admission (to admit a call "
     "that did not fit) or target (occupancy above the target)."),
    ("Pressure", "Admissions delayed and refused/s", "timeseries", "reqps",
     [(f"sum by (outcome) ({rate('entrokv_admissions_total', POOL)})", "{{outcome}}")],
     "Admissions that did not fit: delayed (frames being reclaimed; the worker retries) or "
     "refused (floors reached). EntrokvAdmissionsRefused fires when refusals last 10 minutes."),
    ("Pressure", "Preemptions and swaps/s", "timeseries", "ops",
     [(f"sum by (pool) ({rate('entrokv_preemptions_total', POOL)})", "preempt {{pool}}"),
      (f"sum by (direction) ({rate('entrokv_swaps_total', POOL)})", "swap {{direction}}")],
     "Sequences the daemon asked their owners to preempt, and sequences swapped out to host "
     "memory and resumed."),
    ("Pressure", "Tenant frames against share", "timeseries", "short",
     [(f"sum by (tenant) (entrokv_tenant_used_frames{{{JOB}, {POOL}}})", "used {{tenant}}"),
      (f"sum by (tenant) (entrokv_tenant_guaranteed_frames{{{JOB}, {POOL}}})",
       "guaranteed {{tenant}}")],
     "Frames each tenant's sequences hold, against its guaranteed share (--tenant_share): a "
     "tenant above its share gives first."),
    ("Decisions", "Decisions/s by policy", "timeseries", "ops",
     [(f"sum by (policy) ({rate('entrokv_decisions_total', POOL)})", "{{policy}}")],
     "Layer decisions applied per second, by policy."),
    ("Decisions", "Decision latency p50 / p99 by phase", "timeseries", "s",
     [(quantile(0.5, "entrokv_decision_duration_seconds", "phase"), "p50 {{phase}}"),
      (quantile(0.99, "entrokv_decision_duration_seconds", "phase"), "p99 {{phase}}")],
     "Per-layer decision time by phase (decode, score, select, apply). "
     "EntrokvDecisionLatencyHigh fires when a phase's p99 exceeds 50 ms for 10 minutes."),
    ("Decisions", "Pages evicted/s by reason", "timeseries", "ops",
     [(f"sum by (reason) ({rate('entrokv_pages_evicted_total', POOL)})", "{{reason}}")],
     "Block-table pages evicted: score (by the statistic) or budget (positional policies)."),
    ("Decisions", "Retained mass", "timeseries", "percentunit",
     [(mean("entrokv_retained_mass_ratio", "pool", POOL), "{{pool}}")],
     "Mean share of the pooled attention statistic inside the kept pages, per group."),
    ("Selection", "Shadow union overhead (UOR) distribution", "heatmap", "short",
     [(f"sum by (le) ({rate('entrokv_union_overhead_ratio_bucket', POOL)})", "{{le}}")],
     "How many times its budget a head-independent selection would keep (1 = heads agree, "
     "r = group size). EntrokvUnionOverheadHigh fires when a head_independent pool averages "
     "above 1.5."),
    ("Selection", "Group disagreement", "timeseries", "percentunit",
     [(mean("entrokv_group_disagreement", "pool", POOL), "mean {{pool}}"),
      (quantile(0.9, "entrokv_group_disagreement", "pool", POOL), "p90 {{pool}}")],
     "Mean pairwise Jaccard disagreement of the heads' choices inside a KV group."),
    ("Selection", "Pages retained/s by policy", "timeseries", "ops",
     [(f"sum by (policy) ({rate('entrokv_pages_retained_total', POOL)})", "{{policy}}")],
     "Block-table pages kept by decisions, by policy."),
    ("Selection", "Layer scope: frames saved/s", "timeseries", "ops",
     [(f"sum by (pool) ({rate('entrokv_layer_scope_frames_saved_total', POOL)})", "{{pool}}")],
     "Frames layer-scope selection kept fewer than per-group selection would have (pools in "
     "the layer frame layout; 0 elsewhere)."),
    ("RPC", "RPC rate by method", "timeseries", "reqps",
     [(f"sum by (method) ({rate('entrokv_rpc_requests_total')})", "{{method}}")],
     "Finished calls per second by method."),
    ("RPC", "RPC errors by method and code", "timeseries", "reqps",
     [("sum by (method, code) (" + rate("entrokv_rpc_requests_total", 'code!="OK"') + ")",
       "{{method}} {{code}}")],
     "Calls that did not end OK. EntrokvDecisionErrors and EntrokvShedding watch Decide and "
     "RESOURCE_EXHAUSTED."),
    ("RPC", "RPC latency p99 by method", "timeseries", "s",
     [(quantile(0.99, "entrokv_rpc_duration_seconds", "method"), "{{method}}")],
     "99th percentile handling time per method."),
    ("RPC", "Daemons up", "stat", "short",
     [(f"sum(up{{{JOB}}})", "up")],
     "Scraped entrokvd targets that answered. EntrokvDown fires for one that has not for 2 "
     "minutes."),
]


def datasource():
    return {"type": "prometheus", "uid": "${datasource}"}


def panel_json(panel_id, title, kind, unit, targets, description, grid):
    panel = {
        "id": panel_id,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": datasource(),
        "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{
            "refId": chr(ord("A") + i),
            "datasource": datasource(),
            "expr": expr,
            "legendFormat": legend,
            "range": True,
        } for i, (expr, legend) in enumerate(targets)],
    }
    if kind == "heatmap":
        panel["targets"][0]["format"] = "heatmap"
        panel["options"] = {"calculate": False, "yAxis": {"unit": unit},
                            "color": {"scheme": "Oranges", "mode": "scheme"},
                            "cellGap": 1, "rowsFrame": {"layout": "le"}}
    elif kind == "timeseries":
        panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
        panel["fieldConfig"]["defaults"]["custom"] = {"fillOpacity": 10, "lineWidth": 1}
    elif kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    return panel


def layout():
    """(row, panels with gridPos) in dashboard order; used by the JSON and by the renderer."""
    rows, y = [], 0
    for row in dict.fromkeys(p[0] for p in PANELS):
        rows.append((row, y))
        y += 1
        x = 0
        for panel in (p for p in PANELS if p[0] == row):
            width = 24 if panel[2] == "heatmap" else 12
            if x + width > 24:
                x, y = 0, y + 8
            yield row, panel, {"h": 8, "w": width, "x": x, "y": y}
            x += width
        y += 8


def dashboard():
    panels, panel_id, seen_rows = [], 1, set()
    for row, (_, title, kind, unit, targets, description), grid in layout():
        if row not in seen_rows:
            seen_rows.add(row)
            panels.append({"id": panel_id, "type": "row", "title": row, "collapsed": False,
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": grid["y"] - 1}, "panels": []})
            panel_id += 1
        panels.append(panel_json(panel_id, title, kind, unit, targets, description, grid))
        panel_id += 1
    return {
        "uid": DASHBOARD_UID,
        "title": "entrokv",
        "description": "entrokvd: pools, pressure, decisions, selection quality and RPCs "
                       "(generated by deploy/generate.py; edit that, not this file)",
        "tags": ["entrokv"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
            {"name": "pool", "label": "Pool", "type": "query", "datasource": datasource(),
             "definition": f"label_values(entrokv_pool_frames{{{JOB}}}, pool)",
             "query": {"query": f"label_values(entrokv_pool_frames{{{JOB}}}, pool)",
                       "refId": "pool"},
             "multi": True, "includeAll": True, "allValue": ".*", "current": {},
             "refresh": 2, "sort": 1, "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the PromQL of the longer rules) as literal blocks."""


_BlockDumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def prometheus_rule():
    rules = yaml.safe_load(RULES.read_text())
    header = ("# Generated from deploy/prometheus/entrokv.rules.yml by deploy/generate.py: "
              "edit that file,\n# then run `python3 deploy/generate.py`.\n")
    body = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "entrokv", "labels": {"app.kubernetes.io/part-of": "entrokv"}},
        "spec": {"groups": rules["groups"]},
    }
    return header + yaml.dump(body, Dumper=_BlockDumper, sort_keys=False, width=72,
                              default_flow_style=False)


def outputs():
    return {
        DASHBOARD: json.dumps(dashboard(), indent=2) + "\n",
        PROMETHEUS_RULE: prometheus_rule(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a generated file is missing or out of date")
    args = parser.parse_args()
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT.parent)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT.parent)}")
    if stale:
        print("out of date (run python3 deploy/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
