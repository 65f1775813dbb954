# SPDX-License-Identifier: Apache-2.0
"""vgpu-runtime as a process: config.json changes, the exec of the lower runtime, refusals.

The compiled vgpu-runtime (build/bin) asks a real vgpud (tests/support/vgpud_harness.Vgpud on
simgpu) over its lifecycle socket; vgpud decides (shim.runtime.give_vgpu) and modifies
config.json. The lower runtime is a recording script (argv, and config.json as runc
would read it).
"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
from pathlib import Path

import pytest
from support.paths import NATIVE_BIN
from support.process import clean_env
from support.vgpud_harness import Vgpud, pb

from shim.lifecycle import lifecycle_socket

RECORDER = """#!/bin/sh
# A lower runtime that records what it was given.
printf '%s\\n' "$@" > "$0.argv"
cp "$REC_BUNDLE/config.json" "$0.config" 2>/dev/null || true
exit 0
"""

BASE_SPEC = {
    "ociVersion": "1.0.2",
    "process": {"args": ["sh"], "env": ["PATH=/bin", "HOME=/root"], "cwd": "/"},
    "root": {"path": "rootfs"},
    "linux": {"namespaces": [{"type": "mount"}]},
}


RUNTIME = NATIVE_BIN / "vgpu-runtime"


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    path = tmp_path / "lower-runtime"
    path.write_text(RECORDER)
    path.chmod(0o755)
    return path


@pytest.fixture
def vgpud(tmp_path: Path, simgpu_env, recorder: Path):
    (tmp_path / "vgpud").mkdir()
    d = Vgpud(tmp_path / "vgpud", simgpu_env,
              config={"runtime": {"lower": str(recorder)}, "hook": {"wait_s": 5}})
    d.start()
    yield d
    d.close()


def make_bundle(tmp_path: Path, annotations=None, env=None, name="bundle") -> Path:
    bundle = tmp_path / name
    (bundle / "rootfs").mkdir(parents=True)
    spec = json.loads(json.dumps(BASE_SPEC))
    if annotations:
        spec["annotations"] = annotations
    if env:
        spec["process"]["env"] += env
    # Written the way an engine might: indented, with a trailing newline.
    (bundle / "config.json").write_text(json.dumps(spec, indent=3) + "\n")
    return bundle


def runtime(args: list[str], vgpud: Vgpud | None, bundle: Path, *, config: Path | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["REC_BUNDLE"] = str(bundle)
    if vgpud is not None:
        env["VGPU_CONFIG"] = str(vgpud.config_file)
        env["VGPU_SOCKET"] = str(vgpud.socket)
    if config is not None:
        env["VGPU_CONFIG"] = str(config)
    env.update(extra_env or {})
    return subprocess.run([str(RUNTIME), *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=bundle)


def recorded(recorder: Path) -> tuple[list[str], dict | None]:
    argv = recorder.with_name(recorder.name + ".argv").read_text().splitlines()
    cfg = recorder.with_name(recorder.name + ".config")
    return argv, json.loads(cfg.read_text()) if cfg.exists() else None


def slices(vgpud: Vgpud) -> list:
    return list(vgpud.stub.List(pb.ListRequest(), timeout=5).slices)


# --- pass-through --------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    pytest.param(["--root", "R", "create", "--bundle", "{b}", "c1"], id="create-no-request"),
    pytest.param(["run", "-b", "{b}", "c1"], id="run-no-request"),
    pytest.param(["--log", "L", "start", "c1"], id="start"),
    pytest.param(["delete", "--force", "c1"], id="delete"),
    pytest.param(["--version"], id="version"),
])
def test_no_request_passes_through_untouched(tmp_path, recorder, args):
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  lower: {recorder}  # the recorder\n")
    bundle = make_bundle(tmp_path, annotations={"io.kubernetes.cri.sandbox-id": "x"})
    before = (bundle / "config.json").read_bytes()
    args = [a.replace("{b}", str(bundle)) for a in args]
    p = runtime(args, None, bundle, config=config)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    argv, _ = recorded(recorder)
    assert argv == args
    assert (bundle / "config.json").read_bytes() == before


def test_no_request_needs_no_vgpud(tmp_path, recorder):
    """A container that asks for nothing starts without vgpud (none at the socket)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  lower: {recorder}\n"
                      f"paths:\n  socket: {tmp_path / 'nobody.sock'}\nhook:\n  wait_s: 30\n")
    bundle = make_bundle(tmp_path, env=["NOT_VGPU=1"])
    p = runtime(["create", "--bundle", str(bundle), "c1"], None, bundle, config=config)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert recorded(recorder)[0] == ["create", "--bundle", str(bundle), "c1"]


def test_env_request_ignored_where_config_forbids(tmp_path, simgpu_env, recorder):
    d = Vgpud(tmp_path, simgpu_env, config={"runtime": {"lower": str(recorder)},
                                             "hook": {"allow_env_requests": False}})
    d.start()
    try:
        bundle = make_bundle(tmp_path, env=["VGPU_MEMORY=64Mi"])
        before = (bundle / "config.json").read_bytes()
        p = runtime(["create", "--bundle", str(bundle), "c1"], d, bundle)
        assert p.returncode == 0, p.stderr
        assert (bundle / "config.json").read_bytes() == before
        assert slices(d) == []
    finally:
        d.close()


# --- a vGPU request ----------------------------------------------------------------------

def test_annotation_request_modifies_spec_and_execs_lower(tmp_path, vgpud, recorder):
    bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "64Mi",
                                                "vgpu.io/compute": "20"})
    args = ["--root", "R", "--log", str(tmp_path / "log.json"), "--log-format", "json",
            "create", "--bundle", str(bundle), "--pid-file", "/p", "ctr-1"]
    p = runtime(args, vgpud, bundle)
    assert p.returncode == 0, p.stderr
    argv, spec = recorded(recorder)
    assert argv == args
    [s] = slices(vgpud)
    assert s.owner == "ctr-1" and s.owner_pid == 0
    assert [(v.memory_bytes, v.compute_percent) for v in s.vgpus] == [(64 << 20, 20)]
    uuid = s.vgpus[0].gpu_uuid

    assert spec["annotations"] == {"vgpu.io/memory": "64Mi", "vgpu.io/compute": "20",
                                   "vgpu.io/slice": s.id}
    env = spec["process"]["env"]
    assert env[:2] == ["PATH=/bin", "HOME=/root"]
    assert f"CUDA_VISIBLE_DEVICES={uuid}" in env and f"NVIDIA_VISIBLE_DEVICES={uuid}" in env
    # The harness's config maps every GPU to /dev/null (char 1:3).
    assert spec["linux"]["devices"] == [{"path": "/dev/null", "type": "c", "major": 1,
                                         "minor": 3, "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert spec["linux"]["resources"]["devices"] == [
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]
    hooks = spec["hooks"]
    assert set(hooks) == {"prestart", "poststop"}
    # The compiled hook of vgpud's versioned install (never the package's, which a
    # pip install may replace), asking the vgpud that decided; no Python anywhere.
    installed_hook = vgpud.stub.Health(pb.HealthRequest()).paths["hook"]
    assert installed_hook.startswith(str(vgpud.state_dir / "lib"))
    assert filecmp.cmp(installed_hook, NATIVE_BIN / "vgpu-hook", shallow=False)
    for phase in ("prestart", "poststop"):
        [h] = hooks[phase]
        assert h["path"] == installed_hook
        assert h["args"] == [h["path"], phase]
        assert f"VGPU_CONFIG={vgpud.config_file}" in h["env"]
        assert f"VGPU_SOCKET={vgpud.socket}" in h["env"]
        assert not [e for e in h["env"] if e.startswith(("VGPU_PYTHON=", "PYTHONPATH="))]
        assert h["timeout"] >= 5 + 10
    # Untouched parts stay.
    assert spec["linux"]["namespaces"] == [{"type": "mount"}]
    assert spec["root"] == {"path": "rootfs"}
    # The spec runc reads is the one the recorder saw.
    assert json.loads((bundle / "config.json").read_text()) == spec


def test_create_twice_is_idempotent(tmp_path, vgpud, recorder):
    bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "64Mi"})
    args = ["create", "--bundle", str(bundle), "c2"]
    assert runtime(args, vgpud, bundle).returncode == 0
    first = json.loads((bundle / "config.json").read_text())
    p = runtime(args, vgpud, bundle)
    assert p.returncode == 0, p.stderr
    assert json.loads((bundle / "config.json").read_text()) == first
    assert len(slices(vgpud)) == 1


def test_env_request_marks_spec(tmp_path, vgpud, recorder):
    bundle = make_bundle(tmp_path, env=["VGPU_MEMORY=32Mi", "VGPU_COUNT=1"])
    p = runtime(["run", "-b", str(bundle), "c3"], vgpud, bundle)
    assert p.returncode == 0, p.stderr
    _, spec = recorded(recorder)
    [s] = slices(vgpud)
    assert s.vgpus[0].memory_bytes == 32 << 20
    assert spec["annotations"] == {"vgpu.io/slice": s.id, "vgpu.io/env-requests": "allowed"}


def test_count_two_lists_both_gpus_in_order(tmp_path, simgpu_env, recorder):
    d = Vgpud(tmp_path, simgpu_env, config={"runtime": {"lower": str(recorder)}},
              devices="4Gi,4Gi")
    d.start()
    try:
        bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "1Gi",
                                                    "vgpu.io/count": "2"})
        p = runtime(["create", "--bundle", str(bundle), "c4"], d, bundle)
        assert p.returncode == 0, p.stderr
        _, spec = recorded(recorder)
        [s] = slices(d)
        uuids = ",".join(v.gpu_uuid for v in sorted(s.vgpus, key=lambda v: v.index))
        assert len(s.vgpus) == 2
        assert f"CUDA_VISIBLE_DEVICES={uuids}" in spec["process"]["env"]
        assert len(spec["linux"]["devices"]) == 1   # /dev/null once
    finally:
        d.close()


# --- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize(("annotations", "line"), [
    pytest.param({"vgpu.io/memory": "lots"}, "vgpu: vgpu.io/memory=lots: not a memory quantity",
                 id="memory-lots"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/compute": "1"},
                 "vgpu: vgpu.io/compute=1: not a compute share", id="compute-1"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/priority": "urgent"},
                 "vgpu: vgpu.io/priority=urgent: not a priority", id="priority-unknown"),
    pytest.param({"vgpu.io/memory": "64Mi", "vgpu.io/count": "3"},
                 "vgpu: vgpu.io/count: 3 vGPUs need 3 distinct GPUs", id="count-too-big"),
    pytest.param({"vgpu.io/memory": "64Gi"}, "vgpu: no GPU has room", id="no-room"),
    pytest.param({"vgpu.io/memroy": "64Mi"}, "vgpu: vgpu.io/memroy=64Mi: unknown key",
                 id="misspelt-key"),
])
def test_bad_request_fails_with_one_line_and_no_slice(tmp_path, vgpud, recorder,
                                                      annotations, line):
    bundle = make_bundle(tmp_path, annotations=annotations)
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    p = runtime(["--log", str(log), "--log-format", "json", "create", "--bundle", str(bundle),
                 "bad"], vgpud, bundle)
    assert p.returncode == 1
    assert p.stdout == ""
    assert len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith(line), p.stderr
    # containerd's runc shim reads the error from runc's json log.
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and entry["msg"] == p.stderr.strip()
    assert not recorder.with_name(recorder.name + ".argv").exists()
    assert (bundle / "config.json").read_bytes() == before
    assert slices(vgpud) == []


def test_vgpud_down_fails_within_the_wait(tmp_path, recorder):
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  lower: {recorder}\nhook:\n  wait_s: 0.5\n"
                      f"paths:\n  socket: {tmp_path / 'nobody.sock'}\n")
    bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "64Mi"})
    log = tmp_path / "log.txt"
    p = runtime(["--log", str(log), "create", "--bundle", str(bundle), "c5"], None, bundle,
                config=config)
    assert p.returncode == 1
    assert p.stderr == (f"vgpu: failed to allocate a vGPU: vgpud at "
                        f"{lifecycle_socket(tmp_path / 'nobody.sock')} did not answer within "
                        f"0.5s (is vgpud running?)\n")
    # runc's text log format: what containerd shows for a runtime that failed.
    assert "level=error" in log.read_text() and "did not answer within 0.5s" in log.read_text()
    assert not recorder.with_name(recorder.name + ".argv").exists()


def test_lower_runtime_missing_releases_nothing_left(tmp_path, simgpu_env):
    d = Vgpud(tmp_path, simgpu_env, config={"runtime": {"lower": "no-such-runtime-xyz"}})
    d.start()
    try:
        bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "64Mi"})
        p = runtime(["create", "--bundle", str(bundle), "c6"], d, bundle)
        assert p.returncode == 1
        assert "failed to find the lower runtime 'no-such-runtime-xyz'" in p.stderr
        assert slices(d) == []
    finally:
        d.close()


def test_lower_runtime_that_is_ourselves_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  lower: {RUNTIME}\n")
    bundle = make_bundle(tmp_path)
    p = runtime(["state", "c7"], None, bundle, config=config)
    assert p.returncode == 1
    assert "it is vgpu-runtime itself" in p.stderr and len(p.stderr.splitlines()) == 1


def test_lower_found_on_path_skips_the_shim_bin_dir(tmp_path, recorder):
    """containerd-shim-vgpu-v2 puts a private dir whose `runc` is vgpu-runtime first on
    PATH ($VGPU_SHIM_BIN): the real runc is the next one."""
    shim_bin = tmp_path / "shim-bin"
    shim_bin.mkdir()
    (shim_bin / "runc").write_text("#!/bin/sh\necho private runc ran >&2; exit 99\n")
    (shim_bin / "runc").chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "runc").symlink_to(recorder)
    bundle = make_bundle(tmp_path)
    p = runtime(["state", "c8"], None, bundle, config=tmp_path / "absent.yaml",
                extra_env={"PATH": f"{shim_bin}:{bindir}:{os.environ['PATH']}",
                           "VGPU_SHIM_BIN": str(shim_bin)})
    assert p.returncode == 0, p.stderr
    assert recorded(bindir / "runc")[0] == ["state", "c8"]


def test_lower_runtime_that_cannot_be_exec_d_gives_the_slice_back(tmp_path, simgpu_env):
    broken = tmp_path / "broken-runtime"
    broken.write_bytes(b"\x00\x01 not a program")
    broken.chmod(0o755)
    d = Vgpud(tmp_path, simgpu_env, config={"runtime": {"lower": str(broken)}})
    d.start()
    try:
        bundle = make_bundle(tmp_path, annotations={"vgpu.io/memory": "64Mi"})
        p = runtime(["create", "--bundle", str(bundle), "c9"], d, bundle)
        assert p.returncode == 1
        assert "failed to run the lower runtime" in p.stderr, p.stderr
        assert len(p.stderr.splitlines()) == 1, p.stderr
        assert slices(d) == []
        assert len(d.events("allocate")) == len(d.events("release")) == 1
    finally:
        d.close()
