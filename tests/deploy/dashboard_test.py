#!/usr/bin/env python3
"""Checks the Grafana dashboard (deploy/grafana/entrokv.json) for what Grafana cannot run here:
a stable uid, the `datasource` and `pool` variables, every panel and query on `${datasource}`,
`$__rate_interval` as the window of every rate()/increase(), the pool variable on every pool
series, unique panel ids, panels inside the 24-column grid without overlaps, a description on
every panel. Then it breaks copies of the dashboard and requires each break to be caught."""

import copy
import json
import pathlib
import re
import sys

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "entrokv.json"
UID = "entrokv-overview"
# Series with a `pool` label (docs/service.md); the others have none.
POOL_SERIES = ("entrokv_pool_frames", "entrokv_pool_capacity_bytes",
               "entrokv_pool_bookkeeping_bytes", "entrokv_sequences_active",
               "entrokv_decisions_total", "entrokv_pages_evicted_total",
               "entrokv_pages_retained_total", "entrokv_union_overhead_ratio",
               "entrokv_group_disagreement", "entrokv_page_union_ratio",
               "entrokv_retained_mass_ratio", "entrokv_group_scope_page_union_ratio",
               "entrokv_layer_scope_frames_saved_total", "entrokv_pool_target_occupancy",
               "entrokv_frames_reclaimed_total", "entrokv_admissions_total",
               "entrokv_preemptions_total", "entrokv_swaps_total", "entrokv_sequences_swapped",
               "entrokv_tenant_used_frames", "entrokv_tenant_guaranteed_frames")


def problems(dashboard):
    found = []
    if dashboard.get("uid") != UID:
        found.append(f"uid is {dashboard.get('uid')!r}, not the stable {UID!r}")
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        found.append("no `datasource` variable of type datasource (prometheus)")
    pool = variables.get("pool", {})
    if pool.get("type") != "query" or not pool.get("includeAll") or not pool.get("multi"):
        found.append("no multi-value `pool` query variable with All")
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        found.append("panel ids are not unique")
    cells = {}
    for panel in dashboard["panels"]:
        grid, name = panel["gridPos"], panel["title"]
        if grid["x"] < 0 or grid["x"] + grid["w"] > 24:
            found.append(f"{name}: outside the 24-column grid")
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                if (x, y) in cells:
                    found.append(f"{name}: overlaps {cells[(x, y)]}")
                    break
                cells[(x, y)] = name
            else:
                continue
            break
    for panel in panels:
        name = panel["title"]
        if not panel.get("description"):
            found.append(f"{name}: no description")
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            found.append(f"{name}: panel data source is not ${{datasource}}")
        if not panel.get("targets"):
            found.append(f"{name}: no query")
        for target in panel.get("targets", []):
            expr = target["expr"]
            if target.get("datasource", {}).get("uid") != "${datasource}":
                found.append(f"{name}: query data source is not ${{datasource}}")
            for function, window in re.findall(r"\b(rate|irate|increase)\(.*?\[([^\]]*)\]", expr):
                if window != "$__rate_interval":
                    found.append(f"{name}: {function}() over [{window}], not [$__rate_interval]")
            for selector in re.findall(r"\b(entrokv_[a-z_]+)\{([^}]*)\}", expr):
                metric, matchers = selector
                if metric.startswith(POOL_SERIES) and 'pool=~"$pool"' not in matchers:
                    found.append(f"{name}: {metric} without pool=~\"$pool\"")
                if 'job="entrokv"' not in matchers:
                    found.append(f"{name}: {metric} without job=\"entrokv\"")
    return found


def main():
    dashboard = json.loads(DASHBOARD.read_text())
    errors = problems(dashboard)

    def first_query(d):
        return [p for p in d["panels"] if p["type"] != "row"][0]["targets"][0]

    def first_rate_query(d):
        return [t for p in d["panels"] for t in p.get("targets", []) if "rate(" in t["expr"]][0]

    breaks = {
        "a changed uid": lambda d: d.update(uid="entrokv"),
        "a fixed rate window": lambda d: first_rate_query(d).update(
            expr=first_rate_query(d)["expr"].replace("$__rate_interval", "5m")),
        "a pool series without $pool": lambda d: first_query(d).update(
            expr=first_query(d)["expr"].replace(', pool=~"$pool"', "")),
        "a hard-coded data source": lambda d: first_query(d).update(
            datasource={"type": "prometheus", "uid": "prom1"}),
        "overlapping panels": lambda d: d["panels"][2]["gridPos"].update(
            d["panels"][1]["gridPos"]),
        "no pool variable": lambda d: d["templating"].update(
            list=[v for v in d["templating"]["list"] if v["name"] != "pool"]),
    }
    missed = []
    for description, damage in breaks.items():
        broken = copy.deepcopy(dashboard)
        damage(broken)
        if not problems(broken):
            missed.append(description)
    for error in errors:
        print("FAIL", error)
    for description in missed:
        print("FAIL the check does not catch", description)
    queries = sum(len(p.get("targets", [])) for p in dashboard["panels"])
    print(f"{len(dashboard['panels'])} panels (rows included), {queries} queries: "
          f"{len(errors)} problems; {len(breaks) - len(missed)}/{len(breaks)} breaks caught")
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())
