# SPDX-License-Identifier: Apache-2.0
"""configs/kubernetes/: valid Kubernetes objects that agree with the code they deploy.

Every object is checked against Kubernetes' own OpenAPI schemas (kubernetes-validate ships
them, offline). The ServiceMonitor is a Prometheus Operator CRD those schemas lack: it is
checked against the few fields of its schema it uses (SERVICEMONITOR below). Then the
manifests are compared with the code: paths and names with arbiter.defaults and vgpud's
config, the metrics port with the config they ship, the RuntimeClass handler with what
`vgpu install containerd` writes, every flag with the program's own parser, and every
dashboard query with the metrics and labels arbiter/daemon/metrics.py exports.

dra/ (the DRA driver: DeviceClass, vgpu-dra-plugin's DaemonSet, its RBAC and admission
policy) and examples/ (a ResourceClaimTemplate and a pod) need resource.k8s.io/v1 with
consumable capacity: they are checked against Kubernetes 1.36, and their CEL (the
DeviceClass selector, the admission policy) is evaluated with cel-python on the objects
the plugin publishes and the requests it sends.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.paths import ROOT

from arbiter import defaults
from arbiter.config import Config, load_config
from arbiter.daemon.metrics import Metrics, Snapshot, parse_address
from arbiter.model import Gpu, Grant, Slice
from arbiter.version import version
from shim.containerd_cri import RUNTIME_NAME

K8S = ROOT / "configs" / "kubernetes"
#: The top level is the kustomize base; `kubectl apply -k configs/kustomize/<overlay>`
#: installs it (tests/project/test_kustomize.py renders and checks each overlay).
#: monitoring/ holds what needs the Prometheus Operator, Prometheus or Grafana.
MONITORING = K8S / "monitoring"
#: The DRA driver, which configs/kustomize/dra adds to the base.
DRA = K8S / "dra"
#: Not applied: what a user writes for a workload.
EXAMPLES = K8S / "examples"
MANIFESTS = sorted([*K8S.glob("*"), *MONITORING.glob("*.yaml"), *DRA.glob("*"),
                    *EXAMPLES.glob("*")])
DASHBOARD = MONITORING / "grafana-dashboard.json"
#: The Kubernetes version the manifests target (the oldest supported release, 1.30 on).
KUBERNETES = "1.30.0"
#: The version dra/ and examples/ target: resource.k8s.io/v1 with consumable capacity
#: (beta and on by default since 1.36).
DRA_KUBERNETES = "1.36.0"
#: Kinds with no namespace.
CLUSTER_SCOPED = {"Namespace", "RuntimeClass", "DeviceClass", "ClusterRole",
                  "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}
VERSION = version()
#: The console scripts the pods run from /opt/vgpu/<version>/bin/.
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
#: Not Kubernetes objects: a job for prometheus.yml, kustomize's lists.
NOT_OBJECTS = {"prometheus-scrape.yaml", "kustomization.yaml"}

#: The part of the Prometheus Operator's ServiceMonitor schema (monitoring.coreos.com/v1)
#: that servicemonitor.yaml uses; unknown fields are refused like the CRD's
#: structural schema prunes them.
SERVICEMONITOR: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object", "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "properties": {
                    "matchLabels": {"type": "object",
                                    "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {
                                          "any": {"type": "boolean"},
                                          "matchNames": {"type": "array",
                                                         "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                        "relabelings": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False, "properties": {
                                "sourceLabels": {"type": "array",
                                                 "items": {"type": "string"}},
                                "targetLabel": {"type": "string"},
                                "regex": {"type": "string"},
                                "action": {"type": "string"}}}}}}},
                "jobLabel": {"type": "string"},
            },
        },
    },
}

#: The part of the Prometheus Operator's PrometheusRule schema that prometheusrule.yaml
#: uses (the rules themselves are checked by promtool: tests/project/test_alerts.py).
PROMETHEUSRULE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False,
                 "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "required": ["name", "rules"],
                     "additionalProperties": False, "properties": {
                         "name": {"type": "string"},
                         "rules": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "required": ["alert", "expr"],
                             "additionalProperties": False, "properties": {
                                 "alert": {"type": "string"},
                                 "expr": {"type": "string"},
                                 "for": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                                 "labels": {"type": "object",
                                            "additionalProperties": {"type": "string"}},
                                 "annotations": {"type": "object", "additionalProperties": {
                                     "type": "string"}}}}}}}}}},
    },
}
#: Prometheus Operator kinds, checked against the partial schemas above.
OPERATOR_SCHEMAS = {"ServiceMonitor": SERVICEMONITOR, "PrometheusRule": PROMETHEUSRULE}


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(path under configs/kubernetes/, object) of every manifest."""
    return [(str(m.relative_to(K8S)), doc) for m in MANIFESTS
            if m.is_file() and m.suffix == ".yaml" and m.name not in NOT_OBJECTS
            for doc in yaml.safe_load_all(m.read_text()) if doc]


def target(name: str) -> str:
    """The Kubernetes version a manifest is checked against."""
    return DRA_KUBERNETES if name.startswith(("dra/", "examples/")) else KUBERNETES


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in objects()
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def containers(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = ds["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def host_paths(ds: dict[str, Any]) -> dict[str, str]:
    """Volume name -> host path."""
    return {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v}


def mounted(container: dict[str, Any], ds: dict[str, Any]) -> dict[str, str]:
    """Mount path in the container -> host path, for its hostPath volumes."""
    hosts = host_paths(ds)
    return {m["mountPath"]: hosts[m["name"]] for m in container.get("volumeMounts", [])
            if m["name"] in hosts}


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{argv[0]} is not given {name}"
    return argv[argv.index(name) + 1]


def shipped_config(tmp_path: Path) -> Config:
    """The vgpu config the ConfigMap ships, as vgpud loads it (schema included)."""
    text = find("ConfigMap", "vgpu-config")["data"]["config.yaml"]
    f = tmp_path / "config.yaml"
    f.write_text(text)
    return load_config(f)


# ---- schemas ----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "doc"), objects(),
                         ids=[f"{n}:{d['kind']}" for n, d in objects()])
def test_every_object_is_valid_for_kubernetes(name, doc):
    if doc["kind"] in OPERATOR_SCHEMAS:
        jsonschema.validate(doc, OPERATOR_SCHEMAS[doc["kind"]])
        return
    kubernetes_validate.validate(doc, target(name), strict=True)


def test_the_schema_checks_refuse_mistakes():
    """Both checks above reject a typo (a check that passes anything checks nothing)."""
    rc = dict(find("RuntimeClass"))
    rc["handlr"] = rc.pop("handler")
    with pytest.raises(kubernetes_validate.ValidationError, match="handler"):
        kubernetes_validate.validate(rc, KUBERNETES, strict=True)
    dc = json.loads(json.dumps(find("DeviceClass")))
    dc["spec"]["extendedResourceNam"] = dc["spec"].pop("extendedResourceName")
    with pytest.raises(kubernetes_validate.ValidationError, match="extendedResourceNam"):
        kubernetes_validate.validate(dc, DRA_KUBERNETES, strict=True)
    sm = json.loads(json.dumps(find("ServiceMonitor")))
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.validate(sm, SERVICEMONITOR)
    pr = json.loads(json.dumps(find("PrometheusRule")))
    pr["spec"]["groups"][0]["rules"][0]["experssion"] = "up == 0"
    with pytest.raises(jsonschema.ValidationError, match="experssion"):
        jsonschema.validate(pr, PROMETHEUSRULE)


def test_the_scrape_job_is_valid_for_prometheus(tmp_path):
    """promtool checks the job; Debian's Prometheus is built without Kubernetes discovery,
    so the check sees the job with a static target in its place (relabelling included)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (scripts/install-deps.sh installs prometheus)")
    doc = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    (job,) = doc["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod",
                                             "namespaces": {"names": ["vgpu-system"]}}]
    job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(doc))
    p = subprocess.run(["promtool", "check", "config", str(f)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- the manifests agree with the code ---------------------------------------------------

def test_runtimeclass_handler_is_the_one_vgpu_install_writes():
    rc = find("RuntimeClass")
    assert rc["metadata"]["name"] == "vgpu" and rc["handler"] == RUNTIME_NAME


def test_the_base_lists_every_top_level_object_namespace_first():
    """The base's kustomization.yaml (configs/kubernetes/) lists each top-level file, the
    namespace first, and dra/ lists its own (a file left out would never be installed).
    monitoring/'s lists what `kubectl apply -k` takes there; each file it names exists."""
    listed = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())["resources"]
    assert listed and all((MONITORING / name).is_file() for name in listed), listed
    for folder in (K8S, DRA):
        listed = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
        files = sorted(p.name for p in folder.iterdir()
                       if p.is_file() and p.suffix == ".yaml" and p.name not in NOT_OBJECTS)
        assert sorted(listed) == files, f"{folder}/kustomization.yaml lists {listed}"
    top = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    kinds = [d["kind"] for name in top for d in yaml.safe_load_all((K8S / name).read_text())
             if d]
    assert kinds[0] == "Namespace" and "ServiceMonitor" not in kinds


def test_everything_lives_in_one_namespace():
    """The examples are the user's: they live in the user's namespace."""
    (ns,) = [d["metadata"]["name"] for _, d in objects() if d["kind"] == "Namespace"]
    namespaced = [d for n, d in objects()
                  if d["kind"] not in CLUSTER_SCOPED and not n.startswith("examples/")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {ns}
    examples = [d for n, d in objects() if n.startswith("examples/")]
    assert examples and not any("namespace" in d["metadata"] for d in examples)


def test_vgpud_runs_with_the_default_paths_and_the_shipped_config(tmp_path):
    ds = find("DaemonSet", "vgpu-node")
    vgpud = containers(ds)["vgpud"]
    argv = vgpud["command"]
    assert argv[0] == f"/opt/vgpu/{VERSION}/bin/vgpud" and "vgpud" in SCRIPTS
    config = Config()
    assert flag(argv, "--config") == str(defaults.DEFAULT_CONFIG_PATH)
    assert flag(argv, "--socket") == str(defaults.DEFAULT_SOCKET)
    assert flag(argv, "--run-dir") == str(defaults.DEFAULT_RUN_DIR)
    assert flag(argv, "--state-dir") == str(config.state_dir)
    # Mounted at the same path as on the node: the programs containerd runs on the host
    # find the socket and the config where vgpud does.
    mounts = mounted(vgpud, ds)
    for path in (defaults.DEFAULT_RUN_DIR, config.state_dir,
                 defaults.DEFAULT_CONFIG_PATH.parent, Path("/opt/vgpu")):
        assert mounts.get(str(path)) == str(path), f"{path} is not the node's {path}"
    roots = {str(r) for r in config.runtime_state_roots}
    assert any(mounts.get(r) == r for r in roots), "no runtime state root is mounted"
    # Every flag is one vgpud's own parser takes.
    from arbiter.daemon.server import parse_args
    parse_args(argv[1:])
    # The shipped config is valid for vgpud, and the metrics port is the one exposed.
    shipped = shipped_config(tmp_path)
    _, port = parse_address(shipped.metrics_address)
    assert {p["name"]: p["containerPort"] for p in vgpud["ports"]} == {"metrics": port}
    service = find("Service", "vgpu-metrics")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (port, "metrics")]
    assert service["spec"]["selector"] == ds["spec"]["template"]["metadata"]["labels"]
    monitor = find("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    # Only the monitoring namespace reaches vgpud's pods, on the metrics port alone (issue 22,
    # item 9: the endpoint listens on the pod network).
    policy = find("NetworkPolicy", "vgpu-metrics")["spec"]
    assert policy["podSelector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert [(p["port"], p["protocol"]) for p in rule["ports"]] == [(port, "TCP")]
    [source] = rule["from"]
    assert source == {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}
    assert "hostNetwork" not in ds["spec"]["template"]["spec"]  # a policy would not apply


def test_an_update_starts_the_new_pod_first_and_its_vgpud_waits_for_the_old_one():
    """maxSurge 1 / maxUnavailable 0: a node is never without vgpud's pod; the new vgpud
    takes the state dir over (--wait-lock) once the old pod's vgpud exits, and is ready
    (serves /metrics) while it waits, or the old pod would never be stopped."""
    ds = find("DaemonSet", "vgpu-node")
    strategy = ds["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    vgpud = containers(ds)["vgpud"]
    from arbiter.daemon.server import parse_args
    wait = parse_args(vgpud["command"][1:]).wait_lock
    grace = ds["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert wait > grace, "the new vgpud must outwait the old pod's stop"
    assert vgpud["readinessProbe"]["httpGet"]["port"] == "metrics"


def test_the_init_container_installs_a_versioned_copy_and_the_containerd_handler(tmp_path):
    ds = find("DaemonSet", "vgpu-node")
    init = containers(ds)["install"]
    script = init["args"][0]
    # Copied once under its version, never over a directory running containers use.
    assert f"if [ ! -e /host/opt/vgpu/{VERSION} ]" in script
    assert ds["metadata"]["labels"]["app.kubernetes.io/version"] == VERSION
    assert {c["image"] for c in containers(ds).values()} == {f"vgpu:{VERSION}"}
    assert mounted(init, ds)["/host/opt/vgpu"] == "/opt/vgpu"
    # The containerd config is edited at the node's own path (the drop-in's import line
    # names it), with flags `vgpu install` has.
    assert mounted(init, ds)["/etc/containerd"] == "/etc/containerd"
    line = next(ln for ln in script.replace("\\\n", " ").splitlines()
                if "install containerd" in ln)
    params = {e["name"]: e["value"] for e in init["env"]}
    line = line.replace('"$cfg"', params["VGPU_CONTAINERD_CONFIG"])
    argv = line.split(">")[0].split()
    assert argv[0] == '"$v/bin/vgpu"' and "vgpu" in SCRIPTS
    assert f"v=/opt/vgpu/{VERSION}\n" in script
    from vgpu_cli.args import build_parser
    args = build_parser().parse_args(argv[1:])
    assert (args.target, str(args.config_file)) == ("containerd", "/etc/containerd/config.toml")
    assert mounted(init, ds)[str(args.bin_dir)] == "/usr/local/bin"
    assert mounted(init, ds)[str(defaults.DEFAULT_CONFIG_PATH.parent)] == "/etc/vgpu"
    assert f"/config/config.yaml {defaults.DEFAULT_CONFIG_PATH}" in script
    # containerd is restarted only when the install changed something: the phrase the
    # script looks for is what the first `vgpu install containerd` says, not the second.
    (changed,) = re.findall(r'grep -q "([^"]+)" /tmp/install.out', script)
    changed = changed.replace("$VGPU_ENGINE", params["VGPU_ENGINE"])
    outs = [install_out(tmp_path, "containerd") for _ in range(2)]
    assert [p.returncode for p in outs] == [0, 0]
    assert changed in outs[0].stdout and changed not in outs[1].stdout


def install_out(tmp_path: Path, engine: str) -> subprocess.CompletedProcess[str]:
    """The real `vgpu install` of `engine` (the script's name) on files under tmp_path."""
    if engine == "crio":
        argv = ["podman", "--config-file", str(tmp_path / "hooks.d" / "vgpu.json"),
                "--hook-path", "/opt/vgpu/x/vgpu-hook"]
    else:
        argv = ["containerd", "--config-file", str(tmp_path / "config.toml"), "--bin-dir",
                str(tmp_path / "bin"), "--shim-path", "/opt/vgpu/x/containerd-shim-vgpu-v2"]
    return subprocess.run([sys.executable, "-m", "vgpu_cli", "install", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


#: Stand-ins the init script runs in its chroot: each records its argv in /calls; the
#: vgpu stand-in answers with what the real `vgpu install` said (/stub.*).
STUB_VGPU = """#!/bin/sh
echo "vgpu $*" >> /calls
cat /stub.out
cat /stub.err >&2
exit "$(cat /stub.rc)"
"""
STUB_NSENTER = '#!/bin/sh\necho "nsenter $*" >> /calls\n'


def run_init(tmp_path: Path, engine: str, said: subprocess.CompletedProcess[str],
             ds: dict[str, Any] | None = None, **params: str
             ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The init container's own command run with busybox sh in a chroot laid out like the
    container (its mounts as directories), `vgpu` answering as `said`; (result, calls).
    `ds` is the DaemonSet (default: the base's), `params` env that replaces its own."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed (scripts/install-deps.sh installs it)")
    ds = ds or find("DaemonSet", "vgpu-node")
    init = containers(ds)["install"]
    root = tmp_path / "root"
    for d in ["bin", "tmp", f"opt/vgpu/{VERSION}/bin", *(m["mountPath"].lstrip("/")
                                                        for m in init["volumeMounts"])]:
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ["sh", "cp", "mv", "cat", "grep", "echo", "["]:
        (root / "bin" / applet).symlink_to("busybox")
    for path, text in [(f"opt/vgpu/{VERSION}/bin/vgpu", STUB_VGPU),
                       ("bin/nsenter", STUB_NSENTER)]:
        (root / path).write_text(text)
        (root / path).chmod(0o755)
    (root / "config" / "config.yaml").write_text("paths: {}\n")
    for name, text in [("out", said.stdout), ("err", said.stderr),
                       ("rc", str(said.returncode))]:
        (root / f"stub.{name}").write_text(text)
    env = {"PATH": "/bin", **{e["name"]: e["value"] for e in init.get("env", [])},
           "VGPU_ENGINE": engine, **params}
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    p = subprocess.run([chroot, str(root), *init["command"], init["args"][0]],
                       capture_output=True, text=True, env=env, timeout=60)
    calls = (root / "calls").read_text().splitlines() if (root / "calls").exists() else []
    assert (root / "opt/vgpu" / VERSION).is_dir()
    return p, calls


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_the_init_script_restarts_the_engine_only_when_install_changed_it(tmp_path, engine):
    ds = find("DaemonSet", "vgpu-node")
    init = containers(ds)["install"]
    assert {e["name"]: e["value"] for e in init["env"]}["VGPU_ENGINE"] == "containerd"
    restart = f"nsenter --target 1 --mount -- systemctl restart {engine}"
    params = {"VGPU_RESTART": f"systemctl restart {engine}"}
    first, second = install_out(tmp_path, engine), install_out(tmp_path, engine)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    p, calls = run_init(tmp_path / "first", engine, first, **params)
    assert p.returncode == 0, p.stderr
    assert calls[1:] == [restart] and first.stdout in p.stdout
    assert (tmp_path / "first/root/host/opt/vgpu" / VERSION).is_dir()
    assert (tmp_path / "first/root/etc/vgpu/config.yaml").read_text() == "paths: {}\n"
    # The hook goes where CRI-O looks by default, the containerd drop-in where
    # containerd's config is.
    argv = calls[0].split()
    where = Path(argv[argv.index("--config-file") + 1])
    host = {"crio": "/usr/share/containers/oci/hooks.d", "containerd": "/etc/containerd"}
    assert argv[1:3] == ["install", {"crio": "podman"}.get(engine, engine)]
    assert mounted(init, ds)[str(where.parent)] == host[engine]
    p, calls = run_init(tmp_path / "second", engine, second, **params)
    assert p.returncode == 0, p.stderr
    assert len(calls) == 1 and calls[0].startswith("vgpu install")


def test_the_init_script_fails_loudly_when_install_fails(tmp_path):
    """A config vgpu cannot edit (here one of an unknown version) fails the pod with
    vgpu's line, and containerd is not restarted."""
    (tmp_path / "config.toml").write_text("version = 5\n")
    failed = install_out(tmp_path, "containerd")
    assert failed.returncode == 1
    p, calls = run_init(tmp_path / "run", "containerd", failed)
    assert p.returncode == 1
    assert failed.stderr.strip() in p.stderr and len(calls) == 1
    p, calls = run_init(tmp_path / "typo", "cri-o", failed)
    assert p.returncode == 2 and calls == []
    assert "VGPU_ENGINE is 'cri-o': use containerd or crio" in p.stderr


def test_the_device_plugin_runs_with_its_documented_flags():
    """DESIGN.md's flags, with the plugin's own defaults and vgpud's socket."""
    ds = find("DaemonSet", "vgpu-node")
    plugin = containers(ds)["device-plugin"]
    argv = plugin["command"]
    assert argv[0] == f"/opt/vgpu/{VERSION}/bin/vgpu-device-plugin"
    assert "vgpu-device-plugin" in SCRIPTS
    kubelet_dir = flag(argv, "--kubelet-dir")
    assert kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert flag(argv, "--socket") == str(defaults.DEFAULT_SOCKET)
    assert flag(argv, "--memory-unit") == "256Mi"
    mounts = mounted(plugin, ds)
    assert mounts[kubelet_dir] == kubelet_dir
    assert mounts[str(defaults.DEFAULT_RUN_DIR)] == str(defaults.DEFAULT_RUN_DIR)
    main = ROOT / "vgpu_k8s" / "deviceplugin" / "main.py"
    if not main.is_file():
        pytest.skip("vgpu_k8s/deviceplugin/main.py is not there yet")
    p = subprocess.run([sys.executable, "-m", "vgpu_k8s.deviceplugin.main", *argv[1:],
                        "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    for name in ("--kubelet-dir", "--memory-unit", "--socket"):
        assert name in p.stdout


def test_only_the_dra_plugin_gets_an_api_token():
    """vgpud and the device plugin never talk to the API server: their pod (privileged,
    host PID) gets no token. vgpu-dra-plugin, in its own pod, is the only subject of RBAC."""
    ds = find("DaemonSet", "vgpu-node")
    spec = ds["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert find("ServiceAccount", spec["serviceAccountName"])[
        "automountServiceAccountToken"] is False
    plugin = find("DaemonSet", "vgpu-dra-plugin")["spec"]["template"]["spec"]
    assert plugin["automountServiceAccountToken"] is True
    account = find("ServiceAccount", plugin["serviceAccountName"])
    assert account["metadata"]["namespace"] == "vgpu-system"
    bindings = [d for _, d in objects() if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert [(d["kind"], d["subjects"]) for d in bindings] == [("ClusterRoleBinding", [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"],
         "namespace": "vgpu-system"}])]
    assert not [d for _, d in objects() if d["kind"] == "Role"]


# ---- the DRA driver (dra/, examples/) ------------------------------------------------------

def cel(expression: str, **activation: Any) -> Any:
    """Evaluate a CEL expression (cel-python) with JSON-like values bound to names."""
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def test_the_dra_plugin_runs_with_its_documented_flags_and_the_node_s_paths():
    """The flags are the plugin's own parser's; each dir it uses is the node's, at the
    node's path (the kubelet dials the socket path the plugin reports)."""
    from vgpu_k8s.dra.main import ENV_NODE_NAME, parse_args
    ds = find("DaemonSet", "vgpu-dra-plugin")
    (plugin,) = containers(ds).values()
    argv = plugin["command"]
    assert argv[0] == f"/opt/vgpu/{VERSION}/bin/vgpu-dra-plugin" and "vgpu-dra-plugin" in SCRIPTS
    assert plugin["image"] == f"vgpu:{VERSION}"
    assert ds["metadata"]["labels"]["app.kubernetes.io/version"] == VERSION
    # The node's name from the downward API, as the parser reads it.
    env = {e["name"]: e for e in plugin["env"]}
    assert env[ENV_NODE_NAME]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    settings = parse_args(argv[1:], {ENV_NODE_NAME: "node-a"})
    assert settings.node == "node-a"
    assert settings.vgpud_socket == str(defaults.DEFAULT_SOCKET)
    assert settings.kubeconfig is None   # the pod's own token (access.yaml)
    mounts = mounted(plugin, ds)
    for path in (settings.kubelet_dir / "plugins", settings.kubelet_dir / "plugins_registry",
                 settings.cdi_dir, defaults.DEFAULT_RUN_DIR):
        assert mounts.get(str(path)) == str(path), f"{path} is not the node's {path}"
    # Read-only /dev: the GPUs' device numbers for the specs' deviceNodes, nothing more.
    (dev,) = [m for m in plugin["volumeMounts"] if m["mountPath"] == "/dev"]
    assert dev.get("readOnly") is True and mounts["/dev"] == "/dev"
    assert "privileged" not in plugin["securityContext"]
    # On the nodes vgpud runs on.
    node = find("DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    spec = ds["spec"]["template"]["spec"]
    assert (spec["nodeSelector"], spec["tolerations"]) == (node["nodeSelector"],
                                                           node["tolerations"])


def test_vgpud_finds_the_specs_the_dra_plugin_writes(tmp_path):
    """containerd 1.6: vgpud (runtime-create) applies a claim's spec from its CDI dirs,
    which must hold the plugin's --cdi-dir, mounted from the same node dir."""
    from vgpu_k8s.dra.main import parse_args
    ds = find("DaemonSet", "vgpu-dra-plugin")
    (plugin,) = containers(ds).values()
    cdi_dir = parse_args(plugin["command"][1:], {"NODE_NAME": "n"}).cdi_dir
    assert cdi_dir in shipped_config(tmp_path).cdi_spec_dirs
    node = find("DaemonSet", "vgpu-node")
    assert mounted(containers(node)["vgpud"], node)[str(cdi_dir)] == \
        mounted(plugin, ds)[str(cdi_dir)]


#: A CustomObjectsApi method -> the RBAC verb of its request.
VERBS = {"get": "get", "list": "list", "create": "create", "replace": "update",
         "patch": "patch", "delete": "delete"}


def test_the_cluster_role_grants_exactly_the_calls_the_plugin_makes():
    """Every call of vgpu_k8s/dra/apiserver.py is allowed, and nothing else (no watch,
    no patch, nothing on nodes: the plugin sets no ownerReferences)."""
    source = (ROOT / "vgpu_k8s" / "dra" / "apiserver.py").read_text()
    calls = re.findall(r"self\._api\.(\w+?)_(?:namespaced|cluster)_custom_object,"
                       r"[^\"]*\"(\w+)\"", source)
    assert calls, "no API call found in vgpu_k8s/dra/apiserver.py"
    used = {("resource.k8s.io", resource, VERBS[method]) for method, resource in calls}
    # The core group's calls (a claim's Events).
    used |= {("", resource, VERBS[method]) for method, resource in re.findall(
        r"client\.CoreV1Api\(self\._client\)\.(\w+?)_namespaced_(\w+)", source)}
    assert ("", "event", "create") in used
    used = {(g, "events" if r == "event" else r, v) for g, r, v in used}
    role = find("ClusterRole", "vgpu-dra-plugin")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert granted == used
    binding = find("ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "vgpu-dra-plugin"}


def admission(policy: dict[str, Any], operation: str, user: str, extra: dict[str, list[str]],
              new: dict[str, Any] | None, old: dict[str, Any] | None) -> list[str]:
    """What the API server does with the policy for one request: [] admitted, else the
    messages of the validations that failed. Its match conditions first; its variables in
    order (each sees the ones before)."""
    spec = policy["spec"]
    request = {"operation": operation,
               "userInfo": {"username": user, "groups": [], "extra": extra}}
    names = {"request": request, "object": new, "oldObject": old}
    if not all(cel(c["expression"], **names) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        variables[v["name"]] = cel(v["expression"], **names, variables=variables)
    failed = []
    for check in spec["validations"]:
        if not cel(check["expression"], **names, variables=variables):
            failed.append(str(cel(check["messageExpression"], **names, variables=variables))
                          if "messageExpression" in check else check["message"])
    return failed


def test_the_admission_policy_lets_the_plugin_write_only_its_own_node_s_slices():
    from vgpu_k8s.dra.resourceslice import resource_slice
    policy = find("ValidatingAdmissionPolicy", "vgpu-dra-plugin-own-node")
    binding = find("ValidatingAdmissionPolicyBinding", "vgpu-dra-plugin-own-node")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], sorted(rule["operations"])) == (
        ["resource.k8s.io"], ["resourceslices"], ["CREATE", "DELETE", "UPDATE"])
    plugin = find("DaemonSet", "vgpu-dra-plugin")
    account = plugin["spec"]["template"]["spec"]["serviceAccountName"]
    me = f"system:serviceaccount:{plugin['metadata']['namespace']}:{account}"
    on_a = {"authentication.kubernetes.io/node-name": ["node-a"]}
    mine, theirs = resource_slice("node-a", [], 1), resource_slice("node-b", [], 1)
    every_node = json.loads(json.dumps(mine))
    del every_node["spec"]["nodeName"]
    every_node["spec"]["allNodes"] = True
    own = "vgpu-dra-plugin on node node-a may write only ResourceSlices whose " \
          "spec.nodeName is node-a"

    def check(op: str, new: Any, old: Any, user: str = me, extra: Any = None) -> list[str]:
        return admission(policy, op, user, on_a if extra is None else extra, new, old)
    # Its own node's slice: create, replace, delete.
    assert check("CREATE", mine, None) == []
    assert check("UPDATE", mine, mine) == []
    assert check("DELETE", None, mine) == []
    # Another node's, or a slice for no single node: refused, one line that says why.
    assert check("CREATE", theirs, None) == [own]
    assert check("UPDATE", theirs, theirs) == [own]
    assert check("UPDATE", mine, theirs) == [own]      # taking another node's slice over
    assert check("DELETE", None, theirs) == [own]
    assert check("CREATE", every_node, None) == [own]
    # A token bound to no node (not from the DaemonSet's pod) writes nothing.
    (no_node, also) = check("CREATE", mine, None, extra={})
    assert no_node.startswith("vgpu-dra-plugin's token names no node") and "node-a" not in also
    # Other users (the scheduler, an admin) are not this policy's business.
    assert check("CREATE", theirs, None, user="system:admin", extra={}) == []


def test_the_device_class_selects_exactly_the_plugin_s_devices():
    from vgpu_k8s.deviceplugin.ids import COMPUTE, MEMORY
    from vgpu_k8s.dra.resourceslice import DRIVER
    dc = find("DeviceClass")
    assert dc["metadata"]["name"] == DRIVER
    (selector,) = dc["spec"]["selectors"]
    expression = selector["cel"]["expression"]
    assert cel(expression, device={"driver": DRIVER, "attributes": {}, "capacity": {}})
    assert not cel(expression, device={"driver": "gpu.nvidia.com", "attributes": {},
                                       "capacity": {}})
    # A whole GPU for pods that ask for an extended resource; never the device plugin's.
    assert dc["spec"]["extendedResourceName"] not in (MEMORY, COMPUTE)


def test_the_example_claim_asks_for_what_the_plugin_publishes():
    from kubernetes.utils import parse_quantity

    from vgpu_k8s.dra import resourceslice as rs
    from vgpu_k8s.dra.vgpud import Gpu
    template = find("ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == find("DeviceClass")["metadata"]["name"]
    asked = request["exactly"]["capacity"]["requests"]
    device = rs.resource_slice("n", [Gpu(index=0, uuid="GPU-0", name="sim", memory=16 << 30)],
                               1)["spec"]["devices"][0]
    assert asked.keys() == device["capacity"].keys() == {rs.MEMORY, rs.COMPUTE}
    memory, compute = parse_quantity(asked[rs.MEMORY]), parse_quantity(asked[rs.COMPUTE])
    assert memory >= rs.MEMORY_STEP and memory % rs.MEMORY_STEP == 0
    assert rs.COMPUTE_MIN <= compute <= rs.COMPUTE_MAX and compute == int(compute)
    # The pod names the template, and its container the pod's claim.
    pod = find("Pod")["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert [c["resources"]["claims"] for c in pod["containers"]] == [[{"name": claim["name"]}]]
    assert "runtimeClassName" not in pod   # CDI engines need none (the comment says 1.6's)


# ---- the dashboard -----------------------------------------------------------------------

def exported() -> dict[str, set[str]]:
    """Every series name arbiter/daemon/metrics.py exports, with its label names (one GPU, one
    slice, every measurement present, every counter touched once)."""
    m = Metrics()
    gpu = Gpu(index=0, uuid="GPU-0", name="sim", memory=1 << 30, minor=0)
    sl = Slice(id="s1", owner="c1", grants=(Grant(0, "GPU-0", 1 << 20, 30),))
    m.set_source(lambda: Snapshot(
        gpus=[gpu], slices=[sl], gpu_used={0: 1}, gpu_util={0: 1},
        slice_used={"s1": [1]}, slice_compute_used={"s1": [1]}, slice_gpu_ns={"s1": [1]},
        gpu_handoffs={0: 1}, gpu_revocations={0: 1}))
    m.allocation(0.001, "ok")
    m.release("release")
    m.eviction()
    m.drift()
    m.guard_finding("flag")
    m.bad_usage_file()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


def relabeled() -> set[str]:
    """The target labels the shipped scrape configs add (the same in both: the node)."""
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    by_operator = {r["targetLabel"] for e in monitor["spec"]["endpoints"]
                   for r in e.get("relabelings", []) if "targetLabel" in r}
    plain = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    by_job = {r["target_label"] for job in plain["scrape_configs"]
              for r in job.get("relabel_configs", []) if "target_label" in r}
    assert by_operator == by_job, (by_operator, by_job)
    return by_operator


#: Labels Prometheus adds to every scraped series: its own, and the scrape configs'.
TARGET_LABELS = {"instance", "job"} | relabeled()


def test_both_scrape_configs_name_the_job_the_alerts_select():
    """The ServiceMonitor's job is its Service's jobLabel value; the plain job's name is the
    same: the alerts (prometheusrule.yaml) select that job."""
    monitor = find("ServiceMonitor")
    service = find("Service", "vgpu-metrics")
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    (plain,) = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())[
        "scrape_configs"]
    assert plain["job_name"] == job
    assert f'job="{job}"' in (MONITORING / "prometheusrule.yaml").read_text()


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_dashboard_shows_what_the_issue_names():
    exprs = " ".join(dashboard_queries())
    for metric in ("vgpu_gpu_memory_allocated_bytes", "vgpu_gpu_memory_used_bytes",
                   "vgpu_gpu_compute_allocated_percent", "vgpu_gpu_compute_used_percent",
                   "vgpu_gpu_slices", "vgpu_slice_memory_used_bytes",
                   "rate(vgpu_slice_gpu_seconds_total", "vgpu_drift_total"):
        assert metric in exprs


@pytest.mark.parametrize("expr", dashboard_queries())
def test_each_dashboard_query_names_only_exported_metrics_and_labels(expr):
    series = exported()
    code = re.sub(r'"[^"]*"', '""', expr)                  # label values are not names
    code = re.sub(r"\[[^\]]*\]", "", code)                  # range selectors
    metrics = set(re.findall(r"\bvgpu_\w+", code))
    assert metrics, f"no vgpu metric in {expr}"
    unknown = metrics - series.keys()
    assert not unknown, f"{expr}: arbiter/daemon/metrics.py exports no {sorted(unknown)}"
    labels = set(re.findall(r"(\w+)\s*=~?", code))
    for group in re.findall(r"\b(?:by|on|ignoring|without)\s*\(([^)]*)\)", code):
        labels |= {w.strip() for w in group.split(",") if w.strip()}
    labels |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", code))
    known = set().union(*(series[m] for m in metrics)) | TARGET_LABELS
    assert labels <= known, f"{expr}: labels {sorted(labels - known)} are not exported"
    # The legends name labels the series have too.
    doc = json.loads(DASHBOARD.read_text())
    legends = [t.get("legendFormat", "") for p in doc["panels"] for t in p.get("targets", [])
               if t["expr"] == expr]
    for legend in legends:
        used = set(re.findall(r"\{\{(\w+)\}\}", legend))
        assert used <= known, f"{expr}: legend {legend!r} names {sorted(used - known)}"
