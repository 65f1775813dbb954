# SPDX-License-Identifier: Apache-2.0
"""A real Prometheus scrapes a real vgpud on simgpu while two slices (shares 30 and 70 %)
run greedy GPU loads; the Grafana dashboard's queries (configs/kubernetes/) asked through
Prometheus' HTTP API return the series the dashboard promises: each slice's achieved share
within a few points of its share, the GPU's allocated memory equal to what the slices hold.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.gpu_loads import GPU_LOAD
from support.paths import ROOT, SIMGPU_DIR
from support.prereq import require
from support.vgpud_harness import Vgpud, simgpu_vgpud

from arbiter.daemon.metrics import SNAPSHOT_REUSE_S

MONITORING = ROOT / "configs" / "kubernetes" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "prometheusrule.yaml"
JOB = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())[
    "scrape_configs"][0]["job_name"]
#: Just over vgpud's snapshot reuse, so every scrape sees a fresh one. At 0.5 s the
#: charged-seconds counter moved only every third scrape (1.5 s steps), and a 5 s
#: rate held three or four steps: a 70 % slice read 85.3-85.5 % about 1 run in 10.
SCRAPE_S = SNAPSHOT_REUSE_S + 0.1
#: The dashboard's $__rate_interval here: several scrapes, well inside the loads' run.
RATE_WINDOW = "5s"
#: The dashboard's query variables (besides the data source) and the node it sees here.
VARIABLES = ("node", "namespace", "pod")
NODE = "node-a"
#: Points a slice's achieved share may be off its share on a shared, noisy VM.
TOLERANCE = 8.0
LOAD_S = 25
SHARES = {"1Gi": 30, "3Gi": 70}
GiB = 1 << 30

require(shutil.which("prometheus") is not None,
        "prometheus is not installed (scripts/install-deps.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A private Prometheus server scraping one target every SCRAPE_S."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        # The shipped alerts, evaluated as often as the scrapes.
        rules = tmp / "rules.yaml"
        rules.write_text(yaml.safe_dump(
            {"groups": yaml.safe_load(ALERTS.read_text())["spec"]["groups"]}))
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{int(SCRAPE_S * 1000)}ms",
                       "scrape_timeout": f"{int(SCRAPE_S * 800)}ms",
                       "evaluation_interval": f"{int(SCRAPE_S * 1000)}ms"},
            "rule_files": [str(rules)],
            # The node label, as the ServiceMonitor's relabeling sets it on a cluster; the
            # job as the shipped scrape config names it (the alerts select it).
            "scrape_configs": [{"job_name": JOB,
                                "static_configs": [{"targets": [target],
                                                    "labels": {"node": NODE}}]}]}))
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={tmp / 'prometheus-data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=log, cwd=tmp)

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
            with contextlib.suppress(OSError):
                self.get("/-/ready")
                return
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready:\n{self.log.read_text()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = json.loads(self.get("/api/v1/query", query=expr))
        assert reply["status"] == "success", f"{expr}: {reply}"
        return list(reply["data"]["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def dashboard_queries() -> dict[str, str]:
    """Panel title / legend -> query, the dashboard's variables filled in as Grafana does."""
    doc = json.loads(DASHBOARD.read_text())
    out = {}
    for panel in doc["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", RATE_WINDOW)
            for name in VARIABLES:
                expr = expr.replace(f"${name}", ".*")   # "All", as Grafana asks
            out[f"{panel['title']}: {t['legendFormat']}"] = expr
    return out


def query_named(queries: dict[str, str], metric: str) -> str:
    (expr,) = [e for e in queries.values() if e.startswith(metric) or
               (e.startswith(f"100 * rate({metric}") and " - " not in e)]
    return expr


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Vgpud, Prometheus]]:
    _, vgpud = simgpu_vgpud(tmp_path, {})
    assert vgpud.metrics_port, vgpud.log()
    prom = Prometheus(tmp_path, f"127.0.0.1:{vgpud.metrics_port}")
    try:
        prom.wait_ready()
        yield vgpud, prom
    finally:
        prom.stop()
        vgpud.close()


def run_loads(vgpud: Vgpud) -> list[subprocess.Popen[str]]:
    """`vgpu run` of a greedy load in a fresh slice per share."""
    env = dict(vgpud.env, VGPU_SOCKET=str(vgpud.socket),
               LD_LIBRARY_PATH=str(SIMGPU_DIR), PYTHONPATH=str(ROOT))
    return [subprocess.Popen(
        [sys.executable, "-m", "vgpu_cli", "run", "--memory", memory, "--compute",
         str(share), "--", str(GPU_LOAD), "--kernel", "busy_1000us", "--seconds", str(LOAD_S)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for memory, share in SHARES.items()]


@pytest.mark.timing   # the slices' achieved shares are checked against their settings
def test_the_dashboards_queries_through_a_real_prometheus(host):
    vgpud, prom = host
    queries = dashboard_queries()
    loads = run_loads(vgpud)
    try:
        # Both slices made, then long enough under load for the rate window to be inside it.
        deadline = time.monotonic() + 30
        while len(prom.query("vgpu_slice_memory_limit_bytes")) < 2:
            assert time.monotonic() < deadline, "vgpud never showed two slices"
            assert all(p.poll() is None for p in loads), [p.communicate() for p in loads]
            time.sleep(0.5)
        time.sleep(10)
        achieved = query_named(queries, "vgpu_slice_gpu_seconds_total")
        shares = {r["metric"]["slice"]: float(r["value"][1])
                  for r in prom.query(query_named(queries, "vgpu_slice_compute_share_percent"))}
        got = {r["metric"]["slice"]: float(r["value"][1]) for r in prom.query(achieved)}
        assert sorted(shares.values()) == [30.0, 70.0]
        assert got.keys() == shares.keys(), got
        for slice_id, share in shares.items():
            assert abs(got[slice_id] - share) <= TOLERANCE, (
                f"slice at {share:g} %: achieved {got[slice_id]:.1f} % ({achieved})")
        # Per GPU: the slices' memory is what the GPU has allocated, their shares its
        # allocated compute; two slices.
        (alloc,) = prom.query(query_named(queries, "vgpu_gpu_memory_allocated_bytes"))
        limits = prom.query(query_named(queries, "vgpu_slice_memory_limit_bytes"))
        assert float(alloc["value"][1]) == sum(float(r["value"][1]) for r in limits) == 4 * GiB
        assert {r["metric"]["gpu"] for r in limits} == {alloc["metric"]["gpu"]}
        (calloc,) = prom.query(query_named(queries, "vgpu_gpu_compute_allocated_percent"))
        assert float(calloc["value"][1]) == 100
        (count,) = prom.query(query_named(queries, "vgpu_gpu_slices"))
        assert float(count["value"][1]) == 2
        # The variables list the node (from the scrape's relabeling), and each GPU and slice
        # series is on it: the dashboard is keyed by node and pod, not the pod's IP.
        doc = json.loads(DASHBOARD.read_text())
        variables = {v["name"]: v for v in doc["templating"]["list"] if v["type"] == "query"}
        assert set(variables) == set(VARIABLES)
        label_values = variables["node"]["query"]
        metric, label = label_values.removeprefix("label_values(").rstrip(")").split(", ")
        assert {r["metric"][label] for r in prom.query(metric)} == {NODE}
        assert {r["metric"]["node"] for r in limits} == {NODE}
        # The shipped alerts evaluate without error, and none fires on a healthy node.
        groups = json.loads(prom.get("/api/v1/rules"))["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert rules and all(r["health"] == "ok" for r in rules), rules
        alerts = json.loads(prom.get("/api/v1/alerts"))["data"]["alerts"]
        assert not alerts, alerts
        # Every query Prometheus accepts, and each has series but the guard's (no finding).
        empty = [name for name, expr in queries.items() if not prom.query(expr)]
        assert all(name.startswith("Memory drift and guard findings: guard") for name in empty), \
            empty
    finally:
        for p in loads:
            if p.poll() is None:
                p.terminate()
            p.communicate(timeout=30)
