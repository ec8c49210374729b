#!/usr/bin/env python3
"""End to end: the real daemon under an `entrokv replay` load, scraped by a real Prometheus.

Starts entrokvd and a `prometheus` server (deploy/prometheus/prometheus.yml with this daemon as
the target, 1 s scrapes, the real rule file), drives the daemon with `entrokv replay` (two
policies on one pool, then a second pool whose sequences stay open), waits until
Prometheus has scraped the result, then evaluates through Prometheus' HTTP API:
  * every PromQL expression of the Grafana dashboard (deploy/grafana/entrokv.json), with
    $__rate_interval and $pool substituted: each must evaluate without error and return data
    (at least one finite sample);
  * every rule expression: each must evaluate without error, and the rule manager must have
    loaded every rule with health "ok";
  * every entrokv_* series name in those expressions must be one the daemon exported.

--render PNG additionally keeps the load running for --load-seconds, queries each panel's
range and draws the panels laid out like the dashboard (deploy/render_dashboard.py); that is how
docs/deploy-dashboard.png was made.

usage: prometheus_e2e_test.py --entrokvd PATH --entrokv PATH [--prometheus PATH]
                              [--render PNG --load-seconds N]
with the Python client on the path (PYTHONPATH=build/client/python), whose
entrokv.parse_listening_line reads the daemon's start-up line.
"""

import argparse
import json
import math
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

import entrokv  # the Python client (PYTHONPATH=build/client/python): the start-up line

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "entrokv.json"
RULES = ROOT / "deploy" / "prometheus" / "entrokv.rules.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
MODEL = "qwen2.5-1.5b"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, condition, timeout_s):
    """Polls `condition` until it returns a true value (returned) or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    sys.exit(f"timed out after {timeout_s} s waiting for {what}")


class Prometheus:
    def __init__(self, binary, work, target):
        config = yaml.safe_load(SCRAPE.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(RULES)]
        config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
        path = pathlib.Path(work, "prometheus.yml")
        path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(pathlib.Path(work, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={self.url[len('http://'):]}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("prometheus ready", self.ready, 60)

    def ready(self):
        if self.process.poll() is not None:
            sys.exit(f"prometheus exited with {self.process.returncode}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400/422: a PromQL error, with a JSON body
            return json.load(error)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        self.log.close()


def start_daemon(entrokvd, work):
    out = open(pathlib.Path(work, "entrokvd.out"), "w+")
    daemon = subprocess.Popen(
        [entrokvd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
         "--pool_capacity_bytes=536870912", "--worker_threads=2"],
        stdout=out, stderr=subprocess.STDOUT, text=True)

    def listening():
        if daemon.poll() is not None:
            sys.exit(f"entrokvd exited with {daemon.returncode}")
        out.seek(0)
        addresses = entrokv.parse_listening_line(out.read())
        return (addresses.address, addresses.metrics) if addresses else None

    server, metrics = wait_for("entrokvd listening", listening, 30)
    return daemon, server, metrics


def replay(entrokv, server, policies, seed, *extra):
    subprocess.run([entrokv, "replay", "--server", server, "--model", MODEL, "--tokens", "4096",
                    "--budget", "0.2", "--sequences", "2", "--concurrency", "2",
                    "--policy", policies, "--seed", str(seed), "--json", *extra],
                   check=True, stdout=subprocess.DEVNULL)


def load(entrokv, server, seconds, prometheus):
    """The replay load: rounds of two policies (one pooled, one per head) on one pool, at least
    two and until `seconds` have passed (each round after the first re-registers the pool and
    gets ALREADY_EXISTS, which replay accepts: the error panel's data); then a second pool
    whose sequences stay open, so a pool ends occupied. A pool's series appear in
    Prometheus only at the first scrape after its registration, and rate() sees no increase
    before that, so the second round starts only once Prometheus has scraped the pool."""
    start, seed = time.monotonic(), 1
    replay(entrokv, server, "page_entrokv,head_independent", seed)
    wait_for("prometheus to scrape the first pool", lambda: finite_samples(prometheus.api(
        "query", query=f'entrokv_decisions_total{{job="entrokv", pool="{MODEL}"}}')), 30)
    while True:
        seed += 10
        replay(entrokv, server, "page_entrokv,head_independent", seed)
        if time.monotonic() - start >= seconds:
            break
    replay(entrokv, server, "page_entrokv", seed + 10, "--model-id", "open-pool", "--keep-open")


def dashboard_targets():
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def substitute(expr, rate_interval):
    return expr.replace("$__rate_interval", rate_interval).replace("$pool", ".*")


def finite_samples(result):
    values = []
    for series in result["data"]["result"]:
        samples = series.get("values") or [series["value"]]
        values += [float(v) for _, v in samples if math.isfinite(float(v))]
    return values


def check(prometheus, started):
    failures = []
    # Rates over the whole load, so every counter has moved inside the window.
    window = f"{int(time.time() - started) + 5}s"
    for panel, target in dashboard_targets():
        expr = substitute(target["expr"], window)
        result = prometheus.api("query", query=expr)
        name = f"panel '{panel['title']}' {target['refId']}"
        if result["status"] != "success":
            failures.append(f"{name}: {result.get('error')}: {expr}")
        elif not finite_samples(result):
            failures.append(f"{name}: no data: {expr}")
        else:
            print(f"ok   {name}: {len(result['data']['result'])} series")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            result = prometheus.api("query", query=rule["expr"])
            if result["status"] != "success":
                failures.append(f"rule {rule['alert']}: {result.get('error')}")
            else:
                print(f"ok   rule {rule['alert']}: evaluates "
                      f"({len(result['data']['result'])} series now)")
    # A misspelt metric evaluates without error and never fires or draws: every entrokv_*
    # name in the dashboard and the rules must be a series Prometheus scraped from the daemon.
    scraped = set(prometheus.api("label/__name__/values")["data"])
    exprs = [t["expr"] for _, t in dashboard_targets()]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for name in sorted({n for e in exprs for n in re.findall(r"\bentrokv_[a-z_]+", e)}):
        if name not in scraped:
            failures.append(f"{name} is used but not exported by entrokvd")
    loaded = wait_for("the rule manager to evaluate every rule", lambda: (
        [r for g in prometheus.api("rules")["data"]["groups"] for r in g["rules"]
         if r.get("lastEvaluation", "").startswith("20")] or None), 30)
    expected = sum(len(g["rules"]) for g in rules["groups"])
    if len(loaded) != expected:
        failures.append(f"prometheus loaded {len(loaded)} rules, the file has {expected}")
    for rule in loaded:
        if rule["health"] != "ok":
            failures.append(
                f"rule {rule['name']}: health {rule['health']}: {rule.get('lastError')}")
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--entrokvd", required=True)
    parser.add_argument("--entrokv", required=True)
    parser.add_argument("--prometheus", default="prometheus")
    parser.add_argument("--render", help="also draw the dashboard's panels into this PNG")
    parser.add_argument("--load-seconds", type=float, default=0)
    args = parser.parse_args()
    begun = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        daemon, server, metrics = start_daemon(args.entrokvd, work)
        prometheus = None
        try:
            prometheus = Prometheus(args.prometheus, work, metrics)
            wait_for("the first scrape", lambda: finite_samples(
                prometheus.api("query", query='up{job="entrokv"} == 1')), 30)
            started = time.time()
            load(args.entrokv, server, args.load_seconds, prometheus)
            # The scrape after the load: Prometheus holds the final counters once its newest
            # sample of decisions equals what the daemon serves now.
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
                text = response.read().decode()
            total = sum(float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith("entrokv_decisions_total{"))
            wait_for("prometheus to scrape the load", lambda: any(
                v == total for v in finite_samples(prometheus.api(
                    "query", query='sum(entrokv_decisions_total{job="entrokv"})'))), 30)
            failures = check(prometheus, started)
            if args.render:
                sys.path.insert(0, str(ROOT / "deploy"))
                import render_dashboard
                render_dashboard.render(prometheus.api, started - 2, time.time(), args.render)
                print(f"rendered {args.render}")
        finally:
            if prometheus:
                prometheus.stop()
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=30)
    if code != 0:
        failures.append(f"entrokvd exited {code} after SIGTERM")
    for failure in failures:
        print("FAIL", failure)
    panels = sum(1 for _ in dashboard_targets())
    print(f"{panels} dashboard queries and the rules evaluated in "
          f"{time.monotonic() - begun:.1f} s: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
