# SPDX-License-Identifier: Apache-2.0
"""configs/kustomize/: the overlays an operator installs, rendered and checked.

Each overlay (containerd 1.x, containerd 2.x, CRI-O, GPU Operator, DRA) is rendered with
the tests' own renderer (tests/support/kustomize.py: no maintained kustomize ships on PyPI
or npm) and every object it makes is validated against Kubernetes 1.31, 1.34 and the
newest schema kubernetes-validate has. Where `kubectl` is installed its built-in kustomize
renders each overlay too, and the two must make the same objects. Then what each overlay
is for is checked on what it renders: the node parameters of the init container, the node
selection shared by the DaemonSets and the RuntimeClass, resources and probes on every
container, and the init script itself run (busybox, in a chroot) with each overlay's
parameters.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.kustomize import KustomizeError, key_of, render
from support.paths import ROOT

sys.path.insert(0, str(Path(__file__).parent))
from test_manifests import containers, install_out, mounted, run_init

OVERLAYS_DIR = ROOT / "configs" / "kustomize"
OVERLAYS = ["containerd", "containerd2", "crio", "gpu-operator", "dra"]
BASE = ROOT / "configs" / "kubernetes"
MANUAL_LABEL = BASE / "components" / "manual-label"
LATEST = kubernetes_validate.utils.latest_version()
#: The releases every overlay is validated against; DRA's resource.k8s.io/v1 is 1.34 on.
VERSIONS = {o: ["1.31.0", "1.34.0", LATEST] for o in OVERLAYS} | {"dra": ["1.34.0", LATEST]}
GPU_LABEL = {"nvidia.com/gpu.present": "true"}
MANUAL = {"vgpu.io/gpu": "true"}


def rendered(overlay: str | Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    path = overlay if isinstance(overlay, Path) else OVERLAYS_DIR / overlay
    return {key_of(o): o for o in render(path)}


def one(objs: dict, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for (k, _, n), o in objs.items() if k == kind and name in (None, n)]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_every_overlay_is_listed_here():
    assert sorted(p.name for p in OVERLAYS_DIR.iterdir() if p.is_dir()) == sorted(OVERLAYS)


@pytest.mark.parametrize(("overlay", "version"),
                         [(o, v) for o in OVERLAYS for v in VERSIONS[o]],
                         ids=[f"{o}-{v}" for o in OVERLAYS for v in VERSIONS[o]])
def test_every_object_an_overlay_makes_is_valid_for_kubernetes(overlay, version):
    objs = rendered(overlay)
    assert one(objs, "Namespace")["metadata"]["name"] == "vgpu-system"
    for obj in objs.values():
        kubernetes_validate.validate(obj, version, strict=True)


def test_dra_needs_1_34():
    """1.31 has no resource.k8s.io/v1: the DRA overlay is not for it (docs say 1.34+)."""
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(one(rendered("dra"), "DeviceClass"), "1.31.0",
                                     strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl is not installed (its kustomize cross-checks ours)")
@pytest.mark.parametrize("overlay", [*OVERLAYS, "monitoring"])
def test_kubectl_kustomize_makes_the_same_objects(overlay):
    path = BASE / "monitoring" if overlay == "monitoring" else OVERLAYS_DIR / overlay
    p = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    theirs = {key_of(o): o for o in yaml.safe_load_all(p.stdout) if o}
    assert rendered(path) == theirs


# ---- what each overlay is for ---------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_resources_and_every_pod_probes(overlay):
    for ds in (o for (k, _, _), o in rendered(overlay).items() if k == "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= res.get("requests", {}).keys(), c["name"]
            assert "memory" in res.get("limits", {}), c["name"]
        for c in spec["containers"]:
            assert "readinessProbe" in c, f"{ds['metadata']['name']}/{c['name']} has no probe"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agents_and_the_runtime_class_select_the_same_gpu_nodes(overlay):
    objs = rendered(overlay)
    selectors = [o["spec"]["template"]["spec"]["nodeSelector"]
                 for (k, _, _), o in objs.items() if k == "DaemonSet"]
    assert selectors and all(s == GPU_LABEL for s in selectors)
    rcs = [o for (k, _, _), o in objs.items() if k == "RuntimeClass"]
    if overlay == "crio":
        assert rcs == []    # CRI-O has no `vgpu` handler: the hook serves every pod
        return
    (rc,) = rcs
    assert rc["scheduling"]["nodeSelector"] == GPU_LABEL
    node = one(objs, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    assert rc["scheduling"]["tolerations"] == node["tolerations"]


def _overlay_with_manual_label(tmp_path: Path, overlay: str) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS_DIR / overlay, d)],
        "components": [os.path.relpath(MANUAL_LABEL, d)]}))
    return d


@pytest.mark.parametrize("overlay", ["containerd", "dra", "crio"])
def test_the_manual_label_component_selects_vgpu_io_gpu_everywhere(tmp_path, overlay):
    """Without NFD/GFD: nodes labelled vgpu.io/gpu=true by hand, the same label in each
    DaemonSet and the RuntimeClass."""
    objs = rendered(_overlay_with_manual_label(tmp_path, overlay))
    selectors = [o["spec"]["template"]["spec"]["nodeSelector"]
                 for (k, _, _), o in objs.items() if k == "DaemonSet"]
    assert selectors and all(s == MANUAL for s in selectors)
    for rc in (o for (k, _, _), o in objs.items() if k == "RuntimeClass"):
        assert rc["scheduling"]["nodeSelector"] == MANUAL
    for obj in objs.values():
        kubernetes_validate.validate(obj, LATEST, strict=True)
    if shutil.which("kubectl"):
        p = subprocess.run(["kubectl", "kustomize", str(tmp_path / "mine")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert {key_of(o): o for o in yaml.safe_load_all(p.stdout) if o} == objs


#: What each overlay sets in the init container: engine, config, its version, restart.
PARAMS = {
    "containerd": ("containerd", "/etc/containerd/config.toml", "",
                   "systemctl restart containerd"),
    "containerd2": ("containerd", "/etc/containerd/config.toml", "3",
                    "systemctl restart containerd"),
    "crio": ("crio", "/etc/containerd/config.toml", "", "systemctl restart crio"),
    "gpu-operator": ("containerd", "/etc/containerd/config.toml", "",
                     "systemctl restart containerd"),
    "dra": ("containerd", "/etc/containerd/config.toml", "", "systemctl restart containerd"),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_sets_the_node_parameters_it_is_for(overlay):
    objs = rendered(overlay)
    ds = one(objs, "DaemonSet", "vgpu-node")
    init = containers(ds)["install"]
    env = env_of(init)
    assert (env["VGPU_ENGINE"], env["VGPU_CONTAINERD_CONFIG"],
            env["VGPU_CONTAINERD_CONFIG_VERSION"], env["VGPU_RESTART"]) == PARAMS[overlay]
    # The config's directory is the node's, at the node's path (the import line names it).
    config_dir = str(Path(env["VGPU_CONTAINERD_CONFIG"]).parent)
    assert mounted(init, ds)[config_dir] == config_dir
    spec = ds["spec"]["template"]["spec"]
    assert spec.get("runtimeClassName") == ("nvidia" if overlay == "gpu-operator" else None)
    dra = [o for (k, _, n), o in objs.items() if k == "DaemonSet" and n == "vgpu-dra-plugin"]
    assert bool(dra) == (overlay == "dra")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_init_script_does_what_the_overlay_says(tmp_path, overlay):
    """The script run with the overlay's own env: the install it runs, the config version
    it starts on a node with no config, and the restart it makes in the node's namespace."""
    ds = one(rendered(overlay), "DaemonSet", "vgpu-node")
    engine, config, version, restart = PARAMS[overlay]
    said = install_out(tmp_path, "crio" if engine == "crio" else "containerd")
    assert said.returncode == 0, said.stderr
    p, calls = run_init(tmp_path / "run", engine, said, ds)
    assert p.returncode == 0, p.stderr
    assert calls[1:] == [f"nsenter --target 1 --mount -- {restart}"]
    argv = calls[0].split()
    assert argv[1:3] == ["install", "podman" if engine == "crio" else "containerd"]
    if engine == "containerd":
        assert argv[argv.index("--config-file") + 1] == config
        seeded = tmp_path / "run" / "root" / config.lstrip("/")
        if version:
            assert seeded.read_text() == f"version = {version}\n"
            assert f"none yet, starting one of version {version}" in p.stdout
        else:
            assert not seeded.exists()


def test_an_empty_restart_parameter_restarts_nothing(tmp_path):
    """Nodes whose supervisor restarts the engine itself (k3s-like): VGPU_RESTART=""."""
    ds = one(rendered("containerd"), "DaemonSet", "vgpu-node")
    said = install_out(tmp_path, "containerd")
    p, calls = run_init(tmp_path / "run", "containerd", said, ds, VGPU_RESTART="")
    assert p.returncode == 0, p.stderr
    assert len(calls) == 1 and calls[0].startswith("vgpu install containerd")
    assert "VGPU_RESTART is empty: containerd was not restarted" in p.stdout


def test_a_config_that_exists_is_not_replaced_by_the_seed(tmp_path):
    ds = one(rendered("containerd2"), "DaemonSet", "vgpu-node")
    said = install_out(tmp_path, "containerd")
    existing = tmp_path / "run" / "root" / "etc" / "containerd" / "config.toml"
    existing.parent.mkdir(parents=True)
    existing.write_text("version = 2\n")
    p, _ = run_init(tmp_path / "run", "containerd", said, ds)
    assert p.returncode == 0, p.stderr
    assert existing.read_text() == "version = 2\n" and "none yet" not in p.stdout


# ---- the renderer refuses what it does not apply -----------------------------------------

def _kustomization(tmp_path: Path, doc: dict[str, Any], files: dict[str, str] | None = None
                   ) -> Path:
    d = tmp_path / "k"
    d.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (d / name).write_text(text)
    (d / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return d


CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n"


@pytest.mark.parametrize(("doc", "says"), [
    ({"resources": ["cm.yaml"], "namePrefix": "x-"},
     "key namePrefix is not one this renderer applies"),
    ({"resources": ["cm.yaml"], "images": [{"name": "vgpu", "digest": "sha256:0"}]},
     "images[0]: give name and newName or newTag"),
    ({"resources": ["cm.yaml"], "patches": [{"patch": "data: {a: c}\nkind: ConfigMap\n"
                                                      "metadata: {name: c}\n"}]},
     "no strategic merge"),
    ({"resources": ["cm.yaml"], "patches": [{"patch": "- {op: replace, path: /data/a, "
                                                      "value: c}"}]},
     "a JSON 6902 patch needs a target"),
    ({"resources": ["cm.yaml"], "patches": [{
        "target": {"kind": "ConfigMap", "name": "c"},
        "patch": "- {op: test, path: /data/a, value: x}\n"}]},
     "test /data/a == 'x' failed: it is 'b'"),
    ({"resources": ["cm.yaml"], "patches": [{
        "target": {"kind": "ConfigMap", "name": "c"},
        "patch": "- {op: move, from: /data/a, path: /data/b}\n"}]},
     "op 'move' is not applied here"),
    ({"resources": ["../outside.yaml"]}, "is outside the kustomization's root"),
    ({"resources": ["cm.yaml", "cm.yaml"]}, "ConfigMap//c is added twice"),
], ids=["unknown-key", "image-digest", "strategic-merge", "no-target", "failed-test", "move",
        "outside", "twice"])
def test_the_renderer_refuses_what_it_does_not_apply(tmp_path, doc, says):
    (tmp_path / "outside.yaml").write_text(CM)
    d = _kustomization(tmp_path, {"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                  "kind": "Kustomization", **doc}, {"cm.yaml": CM})
    with pytest.raises(KustomizeError) as e:
        render(d)
    assert says in str(e.value) and str(d) in str(e.value) and "\n" not in str(e.value)


def test_the_renderer_applies_its_patches(tmp_path):
    d = _kustomization(tmp_path, {
        "resources": ["cm.yaml"],
        "patches": [{"target": {"kind": "ConfigMap", "name": "c"}, "patch": yaml.safe_dump([
            {"op": "test", "path": "/data/a", "value": "b"},
            {"op": "replace", "path": "/data/a", "value": "c"},
            {"op": "add", "path": "/data/x~1y", "value": "z"},
            {"op": "add", "path": "/metadata/labels", "value": {"l": "1"}}])},
            {"target": {"kind": "Secret"}, "patch": "- {op: remove, path: /data}\n"}]},
        {"cm.yaml": CM})
    (obj,) = render(d)
    assert obj["data"] == {"a": "c", "x/y": "z"} and obj["metadata"]["labels"] == {"l": "1"}


def test_the_runbook_s_parameter_example_renders_what_it_says(tmp_path):
    """docs/kubernetes.md's own-overlay example, with its resource path pointed at this
    checkout: the parameters it claims to set are set, and nothing else moved."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    marker = "<!-- parameters-example: tests/project/test_kustomize.py renders this overlay -->"
    block = text.split(marker, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    doc = yaml.safe_load(block)
    assert doc["resources"] == ["../vgpu/configs/kustomize/containerd"]
    mine = tmp_path / "my-overlay"
    mine.mkdir()
    doc["resources"] = [os.path.relpath(OVERLAYS_DIR / "containerd", mine)]
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    objs = rendered(mine)
    ds = one(objs, "DaemonSet", "vgpu-node")
    init = containers(ds)["install"]
    env = env_of(init)
    assert (env["VGPU_CONTAINERD_CONFIG"], env["VGPU_RESTART"]) == (
        "/etc/containerd-custom/config.toml", "")
    assert mounted(init, ds)["/etc/containerd-custom"] == "/etc/containerd-custom"
    plugin = containers(ds)["device-plugin"]
    assert mounted(plugin, ds)["/var/lib/kubelet/device-plugins"] == \
        "/data/kubelet/device-plugins"
    base = rendered("containerd")
    assert {k for k in objs if objs[k] != base[k]} == {key_of(ds)}
    for obj in objs.values():
        kubernetes_validate.validate(obj, LATEST, strict=True)
    # The init script with these parameters: the config it names, no restart.
    said = install_out(tmp_path, "containerd")
    p, calls = run_init(tmp_path / "run", "containerd", said, ds)
    assert p.returncode == 0, p.stderr
    argv = calls[0].split()
    assert argv[argv.index("--config-file") + 1] == "/etc/containerd-custom/config.toml"
    assert len(calls) == 1 and "was not restarted" in p.stdout


def test_an_overlay_names_the_image_of_its_registry(tmp_path):
    """The runbook's `images:` (the image pushed to your registry): every container of
    both DaemonSets, the init container included, runs it."""
    mine = tmp_path / "my-overlay"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS_DIR / "dra", mine)],
        "images": [{"name": "vgpu", "newName": "registry.example.com/gpu/vgpu",
                    "newTag": "0.2.0-1"}]}))
    objs = rendered(mine)
    daemonsets = [o for (k, _, _), o in objs.items() if k == "DaemonSet"]
    images = {c["image"] for ds in daemonsets for c in containers(ds).values()}
    assert len(daemonsets) == 2 and images == {"registry.example.com/gpu/vgpu:0.2.0-1"}
    if shutil.which("kubectl"):
        p = subprocess.run(["kubectl", "kustomize", str(mine)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert {key_of(o): o for o in yaml.safe_load_all(p.stdout) if o} == objs


#: Where each engine keeps the OCI bundles whose config.json vgpud reads (containerd's CRI
#: v2 tasks; CRI-O's default runroot, as Podman's: overlay-containers/<id>/userdata).
BUNDLES = {"crio": "/run/containers/storage"}
CONTAINERD_BUNDLES = "/run/containerd/io.containerd.runtime.v2.task"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_vgpud_sees_its_engine_s_bundles_at_the_node_s_path(overlay):
    """vgpud reads a container's config.json at prestart from the bundle path the engine
    hands the hook: without that directory in its pod, a pod that asks for a vGPU could
    not be given one (the hook refuses it)."""
    objs = rendered(overlay)
    spec = one(objs, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    (vgpud,) = [c for c in spec["containers"] if c["name"] == "vgpud"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
               for m in vgpud["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    want = BUNDLES.get(overlay, CONTAINERD_BUNDLES)
    assert mounted.get(want) == want, sorted(mounted)
    (m,) = [m for m in vgpud["volumeMounts"] if m["mountPath"] == want]
    assert m.get("mountPropagation") == "HostToContainer" and not m.get("readOnly")
