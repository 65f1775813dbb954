# SPDX-License-Identifier: Apache-2.0
"""A DRA claim's slice through its CDI spec, on real runc: the spec's container edits
applied to a bundle as a CDI engine applies them (shim.modifiers.CdiEditsModifier, the
same code containerd 1.6's runtime handler uses), its createRuntime hook the compiled
`vgpu-hook claim <slice id>` asking a real vgpud on simgpu.

The container sees exactly the claim's limit, its /etc/ld.so.preload names libvgpu and
keeps the image's own line, and the slice stays with the claim after the container
exits; a hook naming a slice that is not a claim's fails the start with one line and
leaves nothing mounted.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.paths import LIBVGPU, NATIVE_BIN
from support.prereq import require
from support.process import clean_env
from support.runc_host import HOOK, PRELOAD_OWN, Host, MiB, probe_lines
from support.vgpud_harness import pb

from oci_hook import cdi
from shim.modifiers import CdiEditsModifier
from shim.spec import FileSpec

require(os.geteuid() == 0, "runc containers need root")


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()


def claim_slice(host: Host, owner: str, memory: int, kind: str = "claim") -> pb.Slice:
    return host.vgpud.stub.Allocate(pb.AllocateRequest(
        owner=owner, owner_kind=kind, memory_bytes=memory, compute_percent=30), timeout=10).slice


def with_cdi_device(host: Host, bundle: Path, s: pb.Slice, name: str,
                    hook_names: str = "") -> None:
    """What a CDI engine does for `--device vgpu.io/claim=<name>`: the spec's edits (the
    hook naming `hook_names` instead of the slice, where given)."""
    spec = cdi.claim_spec(cdi.view_of_message(s), name=name, libvgpu=LIBVGPU, hook=HOOK,
                          hook_env={"VGPU_SOCKET": str(host.vgpud.socket),
                                    "VGPU_CONFIG": str(host.vgpud.config_file)})
    if hook_names:
        spec["devices"][0]["containerEdits"]["hooks"][0]["args"][-1] = hook_names
    cdi.write_spec(host.cdi_dir, name, spec)
    edits = cdi.find_edits([host.cdi_dir], cdi.device_id(name))
    store = FileSpec.of_bundle(bundle)
    oci = store.load()
    CdiEditsModifier((edits,)).modify(oci)
    store.flush(oci)


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def test_a_claim_container_sees_the_claim_s_limit_and_the_claim_keeps_the_slice(host):
    s = claim_slice(host, "claim-uid-1", 256 * MiB)
    b, cid = host.bundle("cat /etc/ld.so.preload; ls /dev/vgpu0; vgpu_probe info",
                         hooks=False, image_preload=True)
    with_cdi_device(host, b, s, "claim-uid-1")
    p = host.run(b, cid)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:3] == ["/usr/lib/vgpu/libvgpu.so", PRELOAD_OWN, "/dev/vgpu0"]
    info = next(x for x in probe_lines(p.stdout) if x["op"] == "info")
    assert info["total"] == 256 * MiB
    # The claim holds the slice: the container's exit releases nothing.
    assert [x.id for x in host.slices()] == [s.id]
    assert mounts_under(b) == []


@pytest.mark.parametrize(("owner_kind", "slice_id", "reason"), [
    ("container", None, "belongs to container other-ctr, not to a claim"),
    ("claim", "no-such-slice", "slice no-such-slice does not exist (is the claim prepared?)"),
], ids=["a-container-s-slice", "no-such-slice"])
def test_a_hook_naming_no_claim_slice_fails_with_one_line(host, owner_kind, slice_id, reason):
    s = claim_slice(host, "other-ctr" if owner_kind == "container" else "claim-uid-2",
                    128 * MiB, owner_kind)
    b, cid = host.bundle("vgpu_probe info", hooks=False)
    with_cdi_device(host, b, s, "c2", hook_names=slice_id or "")
    p = host.run(b, cid)
    assert p.returncode != 0
    # runc quotes the hook's stderr: exactly one line of ours.
    (ours,) = re.findall(r"stderr: (vgpu: .*?)\\n", p.stderr)
    assert ours.startswith("vgpu: failed to use the claim's vGPU slice: slice ")
    assert ours.endswith(reason), p.stderr
    assert mounts_under(b) == []
    # Nothing was released: the slice that exists stays with its owner.
    assert len(host.slices()) == 1


def test_vgpu_runtime_applies_a_cdi_annotation_s_claim_spec_itself(host):
    """containerd 1.6 has no CDI: its `vgpu` handler passes `cdi.k8s.io/*` annotations on,
    and vgpu-runtime's create (vgpud's runtime-create) applies the claim's spec from its
    CDI dirs (runtime.cdi_spec_dirs: the host's private one, never /var/run/cdi). The pod's
    sandbox, carrying the same pod annotation, is untouched."""
    s = claim_slice(host, "claim-uid-3", 192 * MiB)
    name = f"vgpu-test-{os.getpid()}-3"
    spec = cdi.claim_spec(cdi.view_of_message(s), name=name, libvgpu=LIBVGPU, hook=HOOK,
                          hook_env={"VGPU_SOCKET": str(host.vgpud.socket),
                                    "VGPU_CONFIG": str(host.vgpud.config_file)})
    path = cdi.write_spec(host.cdi_dir, name, spec)
    env = {**clean_env(), "VGPU_SOCKET": str(host.vgpud.socket),
           "VGPU_CONFIG": str(host.vgpud.config_file)}
    request = {"cdi.k8s.io/vgpu.io_claim-uid-3": cdi.device_id(name),
               "cdi.k8s.io/other_x": "example.com/gpu=0"}   # another driver's: ignored
    try:
        b, cid = host.bundle("cat /etc/ld.so.preload; vgpu_probe info", request, hooks=False)
        p = subprocess.run([str(NATIVE_BIN / "vgpu-runtime"), *host.runc("run", "--bundle",
                                                                         str(b), cid)[1:]],
                           env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines()[0] == "/usr/lib/vgpu/libvgpu.so"
        assert next(x for x in probe_lines(p.stdout) if x["op"] == "info")["total"] == \
            192 * MiB
        sandbox, sid = host.bundle("test ! -e /dev/vgpu0 && echo plain",
                                   {**request, "io.kubernetes.cri.container-type": "sandbox"},
                                   hooks=False)
        before = (sandbox / "config.json").read_bytes()
        p = subprocess.run([str(NATIVE_BIN / "vgpu-runtime"), *host.runc(
            "run", "--bundle", str(sandbox), sid)[1:]], env=env, capture_output=True,
            text=True, timeout=60)
        assert (p.returncode, p.stdout) == (0, "plain\n"), p.stderr
        assert (sandbox / "config.json").read_bytes() == before
        # A device whose spec is gone: the create fails with one line, runc never runs.
        path.unlink()
        b, cid = host.bundle("true", request, hooks=False)
        p = subprocess.run([str(NATIVE_BIN / "vgpu-runtime"), *host.runc(
            "run", "--bundle", str(b), cid)[1:]], env=env, capture_output=True, text=True,
            timeout=60)
        assert p.returncode != 0
        assert p.stderr.splitlines()[-1] == (
            f"vgpu: failed to resolve the CDI device {cdi.device_id(name)}: no spec in "
            f"{host.cdi_dir} (is the claim prepared on this node?)")
    finally:
        path.unlink(missing_ok=True)
