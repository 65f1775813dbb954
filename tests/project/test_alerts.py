# SPDX-License-Identifier: Apache-2.0
"""The shipped alerts (configs/kubernetes/monitoring/prometheusrule.yaml), run by Prometheus'
own rule engine: `promtool check rules` on the file as shipped, and `promtool test rules`
with series as vgpud exports them (arbiter/daemon/metrics.py) and the scrape configs label them
(job, instance, node). Each alert fires where it should and stays quiet beside it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import ROOT
from support.prereq import require

RULES = ROOT / "configs" / "kubernetes" / "monitoring" / "prometheusrule.yaml"
SCRAPE = ROOT / "configs" / "kubernetes" / "monitoring" / "prometheus-scrape.yaml"

require(shutil.which("promtool") is not None,
        "promtool is not installed (Debian's prometheus package has it: "
        "scripts/install-deps.sh installs it)")


def job() -> str:
    """The job the plain scrape config names (the ServiceMonitor's jobLabel gives the same)."""
    (only,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    return str(only["job_name"])


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """One input series of node n1's vgpud target."""
    all_labels = {"job": job(), "instance": "10.0.0.1:9400", "node": "n1", **labels}
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def target(**labels: str) -> dict[str, str]:
    return {"job": job(), "instance": "10.0.0.1:9400", "node": "n1", **labels}


def groups(*, annotations: bool) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    if not annotations:  # promtool compares annotations too; the test is about when and whom
        for g in groups:
            for rule in g["rules"]:
                rule.pop("annotations", None)
    return groups


def promtool(*args: str, cwd: Path) -> None:
    p = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_rules_file_as_shipped_is_valid(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups(annotations=True)}))
    promtool("check", "rules", "rules.yaml", cwd=tmp_path)


GPU0 = {"gpu": "0", "uuid": "GPU-0"}
GPU1 = {"gpu": "1", "uuid": "GPU-1"}

CASES: dict[str, tuple[list[dict[str, str]], list[tuple[str, list[dict[str, str]]]]]] = {
    # Scrapes fail from 2m: pending at 3m, firing from 4m (for: 2m).
    "VgpudDown": ([series("up", "1 1 0 0 0 0")],
                  [("3m", []), ("5m", [target(severity="critical")])]),
    # GPU 0's broker goes silent at 1m while it has slices: firing from 2m (for: 1m).
    # GPU 1 has no broker and no slice: nothing to alert on.
    "VgpuBrokerNotServing": (
        [series("vgpu_gpu_broker_serving", "1 0 0 0", **GPU0),
         series("vgpu_gpu_slices", "2 2 2 2", **GPU0),
         series("vgpu_gpu_broker_serving", "0 0 0 0", **GPU1),
         series("vgpu_gpu_slices", "0 0 0 0", **GPU1)],
        [("1m", []), ("3m", [target(severity="critical", **GPU0)])]),
    # One memory kill at 2m: an alert per node, action and resource, at once.
    "VgpuGuardFinding": (
        [series("vgpu_guard_findings_total", "0 0 1 1", action="kill", resource="memory"),
         series("vgpu_guard_findings_total", "0 0 0 0", action="flag", resource="compute")],
        [("1m", []), ("3m", [{"node": "n1", "action": "kill", "resource": "memory",
                              "severity": "warning"}])]),
    # GPU 0 is 95 % allocated from the start (firing from 5m); GPU 1 50 %.
    "VgpuGpuMemoryNearlyAllocated": (
        [series("vgpu_gpu_memory_allocated_bytes", "95x8", **GPU0),
         series("vgpu_gpu_memory_total_bytes", "100x8", **GPU0),
         series("vgpu_gpu_memory_allocated_bytes", "50x8", **GPU1),
         series("vgpu_gpu_memory_total_bytes", "100x8", **GPU1)],
        [("4m", []), ("6m", [target(severity="warning", **GPU0)])]),
}


def test_every_shipped_alert_has_a_case() -> None:
    shipped = {r["alert"] for g in groups(annotations=True) for r in g["rules"] if "alert" in r}
    assert shipped == set(CASES)


@pytest.mark.parametrize("alert", sorted(CASES))
def test_the_alert_fires_where_it_should(alert: str, tmp_path: Path) -> None:
    inputs, expectations = CASES[alert]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups(annotations=False)}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {"eval_time": at, "alertname": alert,
                 "exp_alerts": [{"exp_labels": labels} for labels in firing]}
                for at, firing in expectations],
        }],
    }))
    promtool("test", "rules", "test.yaml", cwd=tmp_path)
