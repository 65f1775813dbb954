# SPDX-License-Identifier: Apache-2.0
"""vgpu-hook (oci_hook/native/vgpu_hook.c) as runc runs it: the OCI state on stdin, a
stand-in vgpud on a real unix socket, real mount namespaces for the mount plan.

A container that asks for nothing exits 0 without vgpud; prestart needs vgpud within
hook.wait_s (one line otherwise); poststop without vgpud leaves the slice to the
reconciler; a vgpud of another protocol version is named with ours; a failed mount
gives the slice back.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.native_programs import Tree, program, run_program

HOOK = program("vgpu-hook")
WAIT_S = 0.5
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


class Host(Tree):
    """The tree, with a bundle and the state runc would pass."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, WAIT_S)
        self.bundle = tmp / "bundle"
        self.bundle.mkdir()
        self.spec({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}})

    def spec(self, spec: dict[str, object] | None) -> None:
        """The bundle's config.json (None: there is none)."""
        path = self.bundle / "config.json"
        if spec is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(spec))

    def state(self, status: str = "created", pid: int = 4242,
              annotations: dict[str, str] | None = None) -> str:
        s: dict[str, object] = {"ociVersion": "1.0.2", "id": "c1", "status": status,
                                "pid": pid, "bundle": str(self.bundle)}
        if annotations is not None:
            s["annotations"] = annotations
        return json.dumps(s)

    def run(self, phase: str, state: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_program([HOOK, phase], self.env(**env), input=state)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def ok(_request):
    return [("v", "2"), ("status", "ok")]


@pytest.mark.parametrize("args", [[], ["start"], ["prestart", "x"], ["poststart"], ["claim"],
                                  ["claim", ""], ["claim", "s1", "x"],
                                  ["createRuntime", "vgpu.io/memory=1Gi", "x=1"],
                                  ["createRuntime", "vgpu.io/memory"],
                                  ["prestart", "vgpu.io/memory=1Gi"]],
                         ids=["none", "unknown", "two", "poststart", "claim-no-slice",
                              "claim-empty-slice", "claim-three", "key-not-vgpu",
                              "key-without-value", "keys-at-prestart"])
def test_usage(host, args):
    p = run_program([HOOK, *args], {}, input="")
    assert p.returncode == 2
    assert p.stderr == ("usage: vgpu-hook prestart|createRuntime|poststop "
                        "[vgpu.io/KEY=VALUE...] | claim SLICE_ID  (the OCI state on stdin)\n")


@pytest.mark.parametrize("phase", ["createRuntime", "poststop"])
def test_a_hook_that_carries_only_compute_exits_at_once_without_vgpud(host, phase):
    """The device plugin's compute CDI device: its keys are read from config.json by the
    memory device's hook; this one does nothing."""
    with host.vgpud(ok) as vgpud:
        p = run_program([HOOK, phase, "vgpu.io/compute=30"], host.env(), input=host.state())
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert vgpud.requests == []


def test_a_hook_that_carries_memory_asks_vgpud_though_nothing_else_asks(host):
    """containerd's default handler passes no annotation: the keys in the hook's arguments
    are what sends the container to vgpud."""
    state = host.state(annotations={})
    with host.vgpud(ok) as vgpud:
        p = run_program([HOOK, "createRuntime", "vgpu.io/memory=1Gi", "vgpu.io/devices=GPU-1"],
                        host.env(), input=state)
        q = run_program([HOOK, "poststop", "vgpu.io/memory=1Gi", "vgpu.io/devices=GPU-1"],
                        host.env(), input=state)
    assert (p.returncode, p.stderr, q.returncode, q.stderr) == (0, "", 0, "")
    assert vgpud.requests == [[("v", "2"), ("op", "prestart"), ("phase", "createRuntime"),
                               ("state", state)], [("v", "2"), ("op", "poststop"),
                                                   ("state", state)]]


@pytest.mark.parametrize("phase", ["prestart", "createRuntime", "poststop"])
def test_a_container_that_asks_for_nothing_exits_at_once_without_vgpud(host, phase):
    with host.vgpud(ok) as vgpud:
        start = time.monotonic()
        p = host.run(phase, host.state(annotations={"org.example/x": "vgpu.io/memory"}))
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert vgpud.requests == [] and time.monotonic() - start < WAIT_S


CRI, CRIO = "io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"
#: A pod's sandbox as the CRI runtimes write it, the pod's vgpu.io/* keys passed through;
#: runc's state carries the spec's annotations.
SANDBOXES = {
    "containerd": {CRI: "sandbox", "vgpu.io/memory": "256Mi", "vgpu.io/priority": "high"},
    "cri-o": {CRIO: "sandbox", "vgpu.io/memory": "256Mi"},
}


@pytest.mark.parametrize("annotations", SANDBOXES.values(), ids=SANDBOXES.keys())
@pytest.mark.parametrize("phase", ["prestart", "createRuntime", "poststop"])
def test_a_pod_sandbox_exits_at_once_with_no_vgpud_at_all(host, phase, annotations):
    host.spec({"ociVersion": "1.0.2", "process": {"env": ["VGPU_MEMORY=1Gi"]},
               "annotations": annotations})
    start = time.monotonic()
    p = host.run(phase, host.state(annotations=annotations))   # nothing listens
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert time.monotonic() - start < WAIT_S


ASKS = {
    "spec-annotation": ({"annotations": {"vgpu.io/memory": "64Mi"}}, None),
    "spec-slice": ({"annotations": {"vgpu.io/slice": "s1"}}, None),
    "spec-env": ({"process": {"env": ["VGPU_MEMORY=64Mi"]}}, None),
    "spec-escaped": ({"annotations": {"\u0076gpu.io/memory": "64Mi"}}, None),
    "state-annotation": ({"process": {"env": []}}, {"vgpu.io/memory": "64Mi"}),
    "no-config-json": (None, None),
    # A pod's application container: vgpud decides (without memory, no vGPU).
    "cri-container": ({"annotations": {CRI: "container", "vgpu.io/priority": "high"}},
                      {CRI: "container", "vgpu.io/priority": "high"}),
}


@pytest.mark.parametrize(("spec", "annotations"), ASKS.values(), ids=ASKS.keys())
@pytest.mark.parametrize("phase", ["prestart", "createRuntime"])
def test_a_container_that_may_ask_is_sent_to_vgpud(host, phase, spec, annotations):
    host.spec(spec)
    state = host.state(annotations=annotations)
    with host.vgpud(ok) as vgpud:
        p = host.run(phase, state)
    assert (p.returncode, p.stderr) == (0, "")
    assert vgpud.requests == [[("v", "2"), ("op", "prestart"), ("phase", phase),
                               ("state", state)]]


@pytest.mark.parametrize("phase", ["poststop", "prestart"])
def test_poststop_and_a_stopped_state_release_through_vgpud(host, phase):
    host.spec({"annotations": {"vgpu.io/memory": "64Mi", "vgpu.io/slice": "s1"}})
    state = host.state(status="stopped", pid=0)
    with host.vgpud(ok) as vgpud:
        p = host.run(phase, state)
    assert (p.returncode, p.stderr) == (0, "")
    assert vgpud.requests == [[("v", "2"), ("op", "poststop"), ("state", state)]]


def test_prestart_without_vgpud_fails_within_wait_s(host):
    host.spec(ASKS["spec-annotation"][0])
    start = time.monotonic()
    p = host.run("prestart", host.state())
    took = time.monotonic() - start
    assert (p.returncode, p.stderr) == (
        1, f"vgpu: failed to allocate a vGPU: vgpud at {host.lifecycle} did not answer within "
           f"{WAIT_S}s (is vgpud running?)\n")
    assert WAIT_S <= took < WAIT_S + 2


@pytest.mark.parametrize(("phase", "status"), [("poststop", "stopped"), ("prestart", "stopped"),
                                               ("poststop", "running")])
def test_poststop_without_vgpud_leaves_the_slice_to_the_reconciler(host, phase, status):
    host.spec({"annotations": {"vgpu.io/slice": "s1"}})
    p = host.run(phase, host.state(status=status))
    assert (p.returncode, p.stderr) == (
        0, f"vgpu: failed to release the vGPU slice of c1: vgpud at {host.lifecycle} did not "
           f"answer within {WAIT_S}s (is vgpud running?); the reconciler will release it\n")


@pytest.mark.parametrize("phase", ["prestart", "poststop"])
def test_a_vgpud_of_another_version_is_named_with_ours(host, phase):
    host.spec(ASKS["spec-annotation"][0])
    with host.vgpud(lambda r: [("v", "1"), ("status", "ok")]) as vgpud:
        p = host.run(phase, host.state())
    assert len(vgpud.requests) == 1
    assert (p.returncode, p.stderr) == (
        1, f"vgpu: vgpu-hook speaks lifecycle protocol v2; vgpud at {host.lifecycle} speaks v1\n")


def test_a_refusal_is_the_one_line(host):
    host.spec(ASKS["spec-annotation"][0])
    message = "vgpu: failed to allocate a vGPU: no GPU has 64 MiB free"
    with host.vgpud(lambda r: [("v", "2"), ("status", "error"), ("message", message)]) as vgpud:
        p = host.run("prestart", host.state())
    assert (p.returncode, p.stderr) == (1, message + "\n")
    assert vgpud.ops() == ["prestart"]


def test_an_unreadable_state_is_one_line(host):
    p = run_program([HOOK, "prestart"], {}, input="x" * (2 << 20))
    assert (p.returncode, p.stderr) == (
        1, "vgpu: failed to read the OCI state on stdin: over 1 MiB\n")


# --- the mount plan ---------------------------------------------------------------------------

@pytest.fixture
def container(tmp_path: Path):
    """A process in a mount namespace of its own (a container's init, as far as the hook
    cares) and a rootfs directory for it."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    mnt = f"/proc/{p.pid}/ns/mnt"
    deadline = time.monotonic() + 10
    while os.readlink(mnt) == os.readlink("/proc/self/ns/mnt"):
        assert time.monotonic() < deadline, "unshare did not start"
        time.sleep(0.01)
    yield p.pid, rootfs
    p.kill()
    p.wait()


def mount_answer(pid: int, rootfs: Path, source: str, target: str):
    def answer(request):
        if dict(request)["op"] == "release":
            return [("v", "2"), ("status", "ok")]
        return [("v", "2"), ("status", "mount"), ("id", "c1"), ("pid", str(pid)),
                ("rootfs", str(rootfs)), ("preload_host", ""), ("preload_line", ""),
                ("mount", ""), ("source", source), ("target", target)]
    return answer


@needs_root
def test_the_plan_is_mounted_inside_the_container_only(host, container):
    pid, rootfs = container
    source = host.tmp / "region"
    source.write_text("slice s1\n")
    host.spec(ASKS["spec-annotation"][0])
    with host.vgpud(mount_answer(pid, rootfs, str(source), "/etc/vgpu-region")) as vgpud:
        p = host.run("prestart", host.state(pid=pid))
    assert (p.returncode, p.stderr) == (0, "")
    assert vgpud.ops() == ["prestart"]
    inside = Path(f"/proc/{pid}/root{rootfs}/etc/vgpu-region")
    assert inside.read_text() == "slice s1\n"
    with pytest.raises(OSError):   # read-only inside
        inside.write_text("forged")
    assert (rootfs / "etc" / "vgpu-region").read_text() == ""   # the host sees the mount point


@needs_root
def test_a_failed_mount_gives_the_slice_back_with_the_state(host, container):
    pid, rootfs = container
    host.spec(ASKS["spec-annotation"][0])
    state = host.state(pid=pid)
    answer = mount_answer(pid, rootfs, str(host.tmp / "no-such-region"), "/etc/vgpu-region")
    with host.vgpud(answer) as vgpud:
        p = host.run("prestart", state)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert p.stderr.startswith("vgpu: failed to set up the vGPU mounts: ")
    assert str(host.tmp / "no-such-region") in p.stderr
    assert vgpud.requests[1] == [("v", "2"), ("op", "release"), ("id", "c1"), ("state", state)]
    assert not (rootfs / "etc" / "vgpu-region").exists()
