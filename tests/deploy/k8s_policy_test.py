#!/usr/bin/env python3
"""Renders every kustomization under deploy/k8s with `kubectl kustomize` and checks the result.

Checks, per rendered object:
  * every container (init containers included): the restricted Pod Security Standard (non-root
    numeric user, read-only root filesystem, no privilege escalation, all capabilities dropped,
    seccomp RuntimeDefault, no host namespaces or host paths), CPU and memory requests and a
    memory limit, GPUs in limits only, a pinned image;
  * the entrokvd container: gRPC startup/readiness/liveness probes on the health service names
    the daemon serves, on a declared port; a native sidecar (restartPolicy: Always) when it is an
    init container; terminationGracePeriodSeconds > preStop + drain_timeout_ms + shutdown margin;
    a host pool (and its arena trailers) that fits its /dev/shm, and a memory limit holding that
    /dev/shm, the daemon-wide bookkeeping bound and the process;
  * the config file (ConfigMap) parses with the real daemon (`entrokvd --config`, started and
    stopped), and the Secret it names is mounted, never rendered: no Secret object, no literal
    env value that looks like a credential;
  * selectors match pod labels, named ports exist where they are referenced (Services,
    NetworkPolicies, probes, PodMonitor, ServiceMonitor), jobLabel gives job="entrokv";
  * the PrometheusRule holds exactly the groups of deploy/prometheus/entrokv.rules.yml.
Then it breaks a copy of the rendered objects in several ways and requires each to be caught.

usage: k8s_policy_test.py [--entrokvd PATH] [--kubectl PATH]
with the Python client on the path (PYTHONPATH=build/client/python).
"""

import argparse
import copy
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile

import yaml

import entrokv  # the Python client (PYTHONPATH=build/client/python): the start-up line

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
WORKLOADS = ["overlays/sidecar", "overlays/daemonset", "overlays/cpu-only", "overlays/node-gpus"]
# Overlays whose one GPU claim must take every GPU of the node (one daemon for all of them).
ALL_GPUS = ["overlays/node-gpus"]
KUSTOMIZATIONS = ["base"] + WORKLOADS + [
    "monitoring/rules", "monitoring/podmonitor", "monitoring/servicemonitor"]
# After drain_timeout_ms the daemon lingers <= 250 ms, stops the server and exits; 5 s covers
# that and the process teardown with a wide margin.
SHUTDOWN_MARGIN_S = 5
# A host arena's object is its frames and a 4 KiB trailer (core/pool/arena.h).
ARENA_TRAILER_BYTES = 4096
# entrokvd's own memory besides its arenas and bookkeeping: code, gRPC buffers, one message in
# flight per worker thread (measured RSS of an idle daemon: about 20 MiB).
PROCESS_BYTES = 256 * 2**20
HEALTH_READY = "entrokv.v1.CacheManager"
HEALTH_LIVE = "entrokv.v1.CacheManager.liveness"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def render(kubectl, kustomization):
    result = subprocess.run([kubectl, "kustomize", str(K8S / kustomization)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"kubectl kustomize {kustomization} failed:\n{result.stderr}")
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def parse_config(text):
    """The daemon's config file is an Abseil flagfile: `--name=value` lines, `#` lines comments."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, value = line.split("=", 1)
            values[name.lstrip("-")] = value
    return values


def quantity_bytes(quantity):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(quantity))
    return float(match.group(1)) * units.get(match.group(2), 1)


def pod_templates(objects):
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield obj, obj["spec"]["template"]


def containers(pod_spec):
    for c in pod_spec.get("initContainers", []):
        yield c, True
    for c in pod_spec.get("containers", []):
        yield c, False


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def container_ports(pod_spec):
    return {p["name"]: p["containerPort"] for c, _ in containers(pod_spec)
            for p in c.get("ports", []) if "name" in p}


class Checker:
    def __init__(self):
        self.errors = []

    def check(self, condition, where, what):
        if not condition:
            self.errors.append(f"{where}: {what}")

    # --- pods -----------------------------------------------------------------------------
    def pod(self, name, objects, workload, template):
        where = f"{name}: {workload['kind']}/{workload['metadata']['name']}"
        spec, labels = template["spec"], template["metadata"].get("labels", {})
        self.check(matches(workload["spec"]["selector"]["matchLabels"], labels), where,
                   "spec.selector does not match the pod template's labels")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            self.check(not spec.get(key), where, f"{key} is set")
        self.check(spec.get("automountServiceAccountToken") is False, where,
                   "automountServiceAccountToken is not false")
        accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
        account = accounts.get(spec.get("serviceAccountName"))
        self.check(account is not None and account.get("automountServiceAccountToken") is False,
                   where, "its ServiceAccount is not rendered here with token automount off")
        pod_sc = spec.get("securityContext", {})
        self.check(pod_sc.get("runAsNonRoot") is True, where, "pod runAsNonRoot is not true")
        self.check(pod_sc.get("runAsUser", 0) > 0, where, "pod runAsUser is not a non-root id")
        self.check(pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where,
                   "pod seccompProfile is not RuntimeDefault")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            self.check("hostPath" not in volume, where, f"volume {volume['name']} is a hostPath")
        claims = {c["name"] for c in spec.get("resourceClaims", [])}
        templates = {o["metadata"]["name"] for o in objects if o["kind"] == "ResourceClaimTemplate"}
        for claim in spec.get("resourceClaims", []):
            self.check(claim.get("resourceClaimTemplateName") in templates, where,
                       f"resource claim {claim['name']} names no rendered ResourceClaimTemplate")
        self.check(not (templates - {c.get("resourceClaimTemplateName")
                                     for c in spec.get("resourceClaims", [])}),
                   where, "a ResourceClaimTemplate is rendered that no pod uses")
        for container, is_init in containers(spec):
            self.container(where, container, is_init, pod_sc, volumes, claims)
            if container["name"] == "entrokvd":
                self.daemon(where, objects, spec, container, is_init, volumes)

    def container(self, where, c, is_init, pod_sc, volumes, claims):
        where = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        self.check(sc.get("allowPrivilegeEscalation") is False, where,
                   "allowPrivilegeEscalation is not false")
        self.check(sc.get("readOnlyRootFilesystem") is True, where,
                   "readOnlyRootFilesystem is not true")
        self.check(not sc.get("privileged"), where, "privileged")
        self.check(sc.get("capabilities", {}).get("drop") == ["ALL"], where,
                   "capabilities.drop is not [ALL]")
        self.check(not sc.get("capabilities", {}).get("add"), where, "adds capabilities")
        self.check(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where,
                   "runAsNonRoot is not true")
        self.check(sc.get("runAsUser", pod_sc.get("runAsUser", 0)) > 0, where, "runs as root")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        self.check(seccomp == "RuntimeDefault", where, "seccompProfile is not RuntimeDefault")
        image = c.get("image", "")
        self.check(":" in image and not image.endswith(":latest"), where,
                   f"image {image!r} is not pinned to a tag")
        resources = c.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        self.check("cpu" in requests and "memory" in requests, where,
                   "no cpu and memory requests")
        self.check("memory" in limits, where, "no memory limit")
        for gpu in GPU_RESOURCES:
            self.check(gpu not in requests, where, f"{gpu} in requests (limits only)")
        for claim in resources.get("claims", []):
            self.check(claim["name"] in claims, where, f"claims {claim['name']}, not a pod claim")
        for mount in c.get("volumeMounts", []):
            self.check(mount["name"] in volumes, where, f"mounts undeclared volume {mount['name']}")
        for env in c.get("env", []):
            looks_secret = re.search(r"token|secret|password|key", env["name"], re.I)
            self.check(not (looks_secret and "value" in env), where,
                       f"env {env['name']} inlines a credential (use secretKeyRef)")

    def daemon(self, where, objects, spec, c, is_init, volumes):
        where = f"{where} container entrokvd"
        ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
        names = {p.get("name") for p in c.get("ports", [])}
        self.check({"grpc", "metrics"} <= names, where, "ports grpc and metrics are not named")
        probes = (("startupProbe", HEALTH_READY), ("readinessProbe", HEALTH_READY),
                  ("livenessProbe", HEALTH_LIVE))
        for probe_name, service in probes:
            probe = c.get(probe_name, {}).get("grpc")
            self.check(probe is not None, where, f"no gRPC {probe_name}")
            if probe:
                self.check(probe.get("service") == service, where,
                           f"{probe_name} asks for {probe.get('service')!r}, not {service!r}")
                self.check(ports.get(probe["port"]) == "grpc", where,
                           f"{probe_name} port {probe['port']} is not the grpc port")
        if is_init:
            self.check(c.get("restartPolicy") == "Always", where,
                       "an init container without restartPolicy: Always (not a native sidecar)")
        config = self.config(where, objects, c, volumes)
        drain_s = int(config.get("drain_timeout_ms", 10000)) / 1000
        pre_stop = c.get("lifecycle", {}).get("preStop", {})
        pre_stop_s = 0
        if "exec" in pre_stop:
            command = pre_stop["exec"]["command"]
            self.check(command[0] == "sleep" and len(command) == 2, where,
                       f"preStop {command} is not `sleep N`")
            pre_stop_s = float(command[1])
        elif "sleep" in pre_stop:
            pre_stop_s = float(pre_stop["sleep"]["seconds"])
        grace = spec.get("terminationGracePeriodSeconds", 30)
        self.check(grace > pre_stop_s + drain_s + SHUTDOWN_MARGIN_S, where,
                   f"terminationGracePeriodSeconds {grace} <= preStop {pre_stop_s} + drain "
                   f"{drain_s} + shutdown margin {SHUTDOWN_MARGIN_S}")
        listen = config.get("listen", "127.0.0.1:50051")
        metrics = config.get("metrics_listen", "127.0.0.1:9464")
        for address, port_name in ((listen, "grpc"), (metrics, "metrics")):
            host, port = address.rsplit(":", 1)
            self.check(host not in ("127.0.0.1", "localhost", "[::1]"), where,
                       f"{address} is loopback: probes and Prometheus use the pod IP")
            self.check(ports.get(int(port)) == port_name, where,
                       f"{address}'s port is not the container port named {port_name}")
        if config.get("backend", "host") == "host":
            # Host arenas reserve their memory in /dev/shm when they are made (and the daemon
            # refuses to start when the pool cannot fit there): /dev/shm must hold the pool and
            # an arena trailer per model; the memory limit that, the daemon-wide bookkeeping
            # bound and the process itself.
            pool = int(config.get("pool_capacity_bytes", 2**30))
            models = int(config.get("max_models", 256))
            bookkeeping = int(config.get("max_bookkeeping_bytes", 512 * 2**20))
            limit = quantity_bytes(c["resources"]["limits"]["memory"])
            shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            self.check(bool(shm), where, "host pool without a /dev/shm volume")
            shm_bytes = pool + models * ARENA_TRAILER_BYTES
            if shm:
                empty_dir = volumes[shm[0]["name"]].get("emptyDir", {})
                self.check(empty_dir.get("medium") == "Memory", where,
                           "/dev/shm is not a memory-backed emptyDir")
                shm_bytes = max(shm_bytes, quantity_bytes(empty_dir.get("sizeLimit", "0")))
                self.check(quantity_bytes(empty_dir.get("sizeLimit", "0")) >=
                           pool + models * ARENA_TRAILER_BYTES, where,
                           f"/dev/shm sizeLimit is smaller than the host pool ({pool}) and "
                           f"{models} arena trailers")
            needed = shm_bytes + bookkeeping + PROCESS_BYTES
            self.check(limit >= needed, where,
                       f"memory limit {limit:.0f} < /dev/shm {shm_bytes:.0f} + "
                       f"max_bookkeeping_bytes {bookkeeping} + process {PROCESS_BYTES}")
        self.check("token_file" in config, where, "no token_file: the daemon accepts anyone")
        for option in ("token_file", "tls_cert", "tls_key", "tls_ca"):
            path = config.get(option)
            if path:
                mount = [m for m in c.get("volumeMounts", [])
                         if path.startswith(m["mountPath"].rstrip("/") + "/")]
                self.check(bool(mount) and "secret" in volumes.get(mount[0]["name"], {}), where,
                           f"{option} {path} is not on a Secret volume")
        state_dir = config.get("state_dir")
        if state_dir:  # the root filesystem is read-only: the journal needs a writable volume
            mount = [m for m in c.get("volumeMounts", []) if m["mountPath"] == state_dir]
            self.check(bool(mount) and not mount[0].get("readOnly"), where,
                       f"state_dir {state_dir} is not a writable volume mount")
        self.configs.append(config)

    def config(self, where, objects, c, volumes):
        args = c.get("args", [])
        paths = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
        self.check(len(paths) == 1, where, "not started with --config=FILE")
        if not paths:
            return {}
        for mount in c.get("volumeMounts", []):
            if paths[0].startswith(mount["mountPath"].rstrip("/") + "/"):
                volume = volumes[mount["name"]]
                key = paths[0][len(mount["mountPath"].rstrip("/")) + 1:]
                maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
                config_map = maps.get(volume.get("configMap", {}).get("name"))
                self.check(config_map is not None, where, f"{paths[0]} is not a rendered ConfigMap")
                if config_map:
                    self.check(key in config_map["data"], where, f"ConfigMap lacks key {key}")
                    return parse_config(config_map["data"].get(key, ""))
        self.check(False, where, f"{paths[0]} is on no mounted volume")
        return {}

    # --- networking, monitoring ---------------------------------------------------------
    def network(self, name, objects, all_pods):
        pods = [t for _, t in pod_templates(objects)]
        for obj in objects:
            where = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
            if obj["kind"] == "Secret":
                self.check(False, where, "a Secret is rendered: secrets are created out of band")
            if obj["kind"] == "Service":
                selected = [t for t in all_pods if matches(obj["spec"]["selector"],
                                                           t["metadata"]["labels"])]
                self.check(bool(selected), where, "selector matches no pod")
                for port in obj["spec"]["ports"]:
                    target = port.get("targetPort", port["port"])
                    for t in selected:
                        known = container_ports(t["spec"])
                        ok = target in (known if isinstance(target, str) else known.values())
                        self.check(ok, where, f"targetPort {target} is not a port of the pods")
            if obj["kind"] == "NetworkPolicy":
                selected = [t for t in pods if matches(obj["spec"]["podSelector"]["matchLabels"],
                                                       t["metadata"]["labels"])]
                self.check(bool(selected), where, "podSelector matches no pod of this render")
                for rule in obj["spec"].get("ingress", []):
                    for port in rule.get("ports", []):
                        for t in selected:
                            known = container_ports(t["spec"])
                            self.check(port["port"] in (known if isinstance(port["port"], str)
                                                        else known.values()), where,
                                       f"port {port['port']} is not a port of the pods")
            if obj["kind"] == "PodMonitor":
                selected = [t for t in all_pods if matches(obj["spec"]["selector"]["matchLabels"],
                                                           t["metadata"]["labels"])]
                self.check(len(selected) == len(WORKLOADS), where,
                           "selector does not match the pods of every workload overlay")
                for t in selected:
                    job = t["metadata"]["labels"].get(obj["spec"].get("jobLabel"))
                    self.check(job == "entrokv", where, "jobLabel does not give job=\"entrokv\"")
                    for endpoint in obj["spec"]["podMetricsEndpoints"]:
                        self.check(endpoint["port"] in container_ports(t["spec"]), where,
                                   f"port {endpoint['port']} is not a named port of the pods")
            if obj["kind"] == "ServiceMonitor":
                wanted = obj["spec"]["selector"]["matchLabels"]
                services = [o for o in objects
                            if o["kind"] == "Service" and matches(wanted, o["metadata"]["labels"])]
                self.check(len(services) == 1, where, "selector does not match its one Service")
                for service in services:
                    self.check(service["metadata"]["labels"].get(obj["spec"].get("jobLabel"))
                               == "entrokv", where, "jobLabel does not give job=\"entrokv\"")
                    names = {p["name"] for p in service["spec"]["ports"]}
                    for endpoint in obj["spec"]["endpoints"]:
                        self.check(endpoint["port"] in names, where,
                                   f"port {endpoint['port']} is not a port of the Service")
            if obj["kind"] == "PrometheusRule":
                rules = yaml.safe_load((ROOT / "deploy/prometheus/entrokv.rules.yml").read_text())
                self.check(obj["spec"]["groups"] == rules["groups"], where,
                           "groups differ from deploy/prometheus/entrokv.rules.yml "
                           "(run deploy/generate.py)")

    def all_gpus(self, name, objects):
        templates = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
        self.check(len(templates) == 1, name, "not exactly one ResourceClaimTemplate")
        for template in templates:
            requests = template["spec"]["spec"]["devices"]["requests"]
            self.check([r.get("allocationMode") for r in requests] == ["All"], name,
                       "the GPU claim does not take every GPU of the node (allocationMode All)")

    def run(self, renders):
        self.errors, self.configs = [], []
        all_pods = [t for w in WORKLOADS for _, t in pod_templates(renders[w])]
        for name, objects in renders.items():
            for workload, template in pod_templates(objects):
                self.pod(name, objects, workload, template)
            self.network(name, objects, all_pods)
            if name in ALL_GPUS:
                self.all_gpus(name, objects)
        return self.errors


def start_daemon_with(entrokvd, config):
    """Starts the real daemon on the rendered config file (addresses, backend, paths and sizes
    overridden by flags, which win) and stops it with SIGTERM: the file must parse."""
    with tempfile.TemporaryDirectory() as work:
        conf = pathlib.Path(work, "entrokvd.conf")
        conf.write_text("\n".join(f"--{k}={v}" for k, v in config.items()) + "\n")
        token = pathlib.Path(work, "token")
        token.write_text("test-token\n")
        daemon = subprocess.Popen(
            [entrokvd, f"--config={conf}", "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             "--backend=host", "--pool_capacity_bytes=16777216", f"--token_file={token}",
             f"--state_dir={work}", "--worker_threads=1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = daemon.stdout.readline()
        if entrokv.parse_listening_line(line) is None:
            daemon.wait(timeout=10)
            return f"entrokvd refused the config: {daemon.stderr.read().strip()}"
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=30)
        return None if code == 0 else f"entrokvd exited {code} after SIGTERM"


def mutations():
    """(description, function that breaks a render in place) pairs the checker must catch."""
    def daemon_of(renders, overlay):
        for _, t in pod_templates(renders[overlay]):
            for c, _ in containers(t["spec"]):
                if c["name"] == "entrokvd":
                    return t["spec"], c

    def escalate(r):
        daemon_of(r, "overlays/daemonset")[1]["securityContext"]["allowPrivilegeEscalation"] = True

    def short_grace(r):
        daemon_of(r, "overlays/daemonset")[0]["terminationGracePeriodSeconds"] = 15

    def wrong_probe(r):
        daemon_of(r, "overlays/sidecar")[1]["livenessProbe"]["grpc"]["service"] = "liveness"

    def not_native(r):
        del daemon_of(r, "overlays/cpu-only")[1]["restartPolicy"]

    def bad_selector(r):
        service = [o for o in r["overlays/daemonset"] if o["kind"] == "Service"][0]
        service["spec"]["selector"] = {"app.kubernetes.io/name": "entrokvd"}

    def inline_secret(r):
        r["overlays/daemonset"].append({"apiVersion": "v1", "kind": "Secret",
                                        "metadata": {"name": "entrokv-token"},
                                        "stringData": {"token": "x"}})

    def gpu_request(r):
        daemon_of(r, "overlays/sidecar")[1]["resources"]["requests"]["nvidia.com/gpu"] = 1

    def no_state_volume(r):
        container = daemon_of(r, "overlays/cpu-only")[1]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "state"]

    def small_shm(r):
        spec = daemon_of(r, "overlays/daemonset")[0]
        [v for v in spec["volumes"] if v["name"] == "shm"][0]["emptyDir"]["sizeLimit"] = "1Gi"

    def no_room_for_bookkeeping(r):
        container = daemon_of(r, "overlays/cpu-only")[1]
        container["resources"]["limits"]["memory"] = "1600Mi"

    def bad_port(r):
        policy = [o for o in r["overlays/daemonset"] if o["kind"] == "NetworkPolicy"][0]
        policy["spec"]["ingress"][0]["ports"][0]["port"] = "gprc"

    def one_gpu(r):
        claim = [o for o in r["overlays/node-gpus"] if o["kind"] == "ResourceClaimTemplate"][0]
        del claim["spec"]["spec"]["devices"]["requests"][0]["allocationMode"]

    def rule_drift(r):
        rule = [o for o in r["monitoring/rules"] if o["kind"] == "PrometheusRule"][0]
        rule["spec"]["groups"][0]["rules"][0]["for"] = "1m"

    return [("allowPrivilegeEscalation: true", escalate), ("a short grace period", short_grace),
            ("a wrong liveness service", wrong_probe), ("a sidecar that is not native", not_native),
            ("a Service selecting no pod", bad_selector), ("an inlined Secret", inline_secret),
            ("a GPU in requests", gpu_request), ("/dev/shm smaller than the pool", small_shm),
            ("a memory limit without room for bookkeeping", no_room_for_bookkeeping),
            ("a NetworkPolicy port name typo", bad_port), ("a PrometheusRule drift", rule_drift),
            ("state_dir on the read-only root", no_state_volume),
            ("a node's daemon claiming one GPU", one_gpu)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--entrokvd", help="daemon binary: start it on every rendered config")
    parser.add_argument("--kubectl", default=os.environ.get("KUBECTL", "kubectl"))
    args = parser.parse_args()
    renders = {k: render(args.kubectl, k) for k in KUSTOMIZATIONS}
    for name, objects in renders.items():
        print(f"rendered {name}: " + ", ".join(f"{o['kind']}/{o['metadata']['name']}"
                                               for o in objects))
    checker = Checker()
    errors = checker.run(copy.deepcopy(renders))
    if args.entrokvd:
        for config in checker.configs:
            error = start_daemon_with(args.entrokvd, config)
            if error:
                errors.append(error)
        print(f"entrokvd started and stopped cleanly on {len(checker.configs)} rendered configs"
              if not errors else "")
    missed = []
    for description, mutate in mutations():
        broken = copy.deepcopy(renders)
        mutate(broken)
        if not Checker().run(broken):
            missed.append(description)
    for error in errors:
        print("FAIL", error)
    for description in missed:
        print("FAIL the checker does not catch", description)
    checked = sum(1 for r in renders.values() for _ in pod_templates(r))
    print(f"{checked} pod templates in {len(renders)} renders: {len(errors)} violations; "
          f"{len(mutations()) - len(missed)}/{len(mutations())} injected violations caught")
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())
