# SPDX-License-Identifier: Apache-2.0
"""vgpu-runtime (shim/native/vgpu_runtime.c) as engines run it: real processes, a
recording lower runtime (and real runc), a stand-in vgpud on a real unix socket.

Without vgpud a spec that asks for nothing passes straight through; one that may ask
fails within hook.wait_s with one line (also in runc's --log); a vgpud of another
protocol version is named with ours; the lower runtime is found by the program itself.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.native_programs import Recorder, Tree, program, run_program
from support.paths import NATIVE_BIN

RUNTIME = program("vgpu-runtime")
WAIT_S = 0.5


class Host(Tree):
    """The tree, with a fake `runc` first on PATH and bundles."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, WAIT_S)
        self.lower = Recorder(tmp / "lower" / "runc", env_names=("VGPU_RUNTIME_EXEC_PID",))
        self.path = f"{self.lower.path.parent}:{self.path}"

    def bundle(self, spec: object, name: str = "b") -> Path:
        """A bundle whose config.json is `spec` (JSON-encoded unless it is text)."""
        b = self.tmp / name
        b.mkdir(exist_ok=True)
        (b / "config.json").write_text(spec if isinstance(spec, str) else json.dumps(spec))
        return b

    def run(self, *args: str | Path, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run_program([RUNTIME, *args], env or self.env(), cwd=cwd)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def ok(_request):
    return [("v", "2"), ("status", "ok")]


# --- specs that ask for nothing pass through, without vgpud ----------------------------------

CRI, CRIO = "io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"
#: A pod's sandbox (pause) container as containerd's CRI plugin writes it, with the pod's
#: vgpu.io/* keys passed through (pod_annotations).
SANDBOX = {"ociVersion": "1.0.2", "process": {"args": ["/pause"], "env": ["PATH=/bin"]},
           "annotations": {"vgpu.io/memory": "256Mi", "vgpu.io/priority": "high", CRI: "sandbox",
                           "io.kubernetes.cri.sandbox-id": "0123abcd"}}

NOTHING = {
    "plain": {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin"]}},
    "other-annotations": {"annotations": {"io.kubernetes.cri.container-type": "container",
                                          "example.com/vgpu.io": "x"}},
    "request-as-a-value": {"annotations": {"note": "vgpu.io/memory=64Mi"},
                           "process": {"args": ["VGPU_MEMORY=64Mi"]}},
    "nested-annotations": {"linux": {"annotations": {"vgpu.io/memory": "64Mi"}},
                           "process": {"annotations": {"vgpu.io/memory": "1"}}},
    "env-not-a-prefix": {"process": {"env": ["XVGPU_MEMORY=1", "vgpu_memory=1"]}},
    "env-not-under-process": {"env": ["VGPU_MEMORY=64Mi"],
                              "hooks": {"prestart": [{"env": ["VGPU_MEMORY=1"]}]}},
    "annotations-not-an-object": {"annotations": ["vgpu.io/memory"]},
    "escapes-elsewhere": {"annotations": {"caf\u00e9": "\u00e9\n"}, "process": {"cwd": "/\t"}},
    "not-json-no-request": '{"process": {"env": ["A=1"]',
    "deeply-nested": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",   # bounded, no crash
    # A pod's sandbox asks for nothing, whatever the pod's keys (or its env) say.
    "cri-sandbox": SANDBOX,
    "crio-sandbox": {"annotations": {CRIO: "sandbox", "vgpu.io/memory": "1Gi"},
                     "process": {"env": ["VGPU_MEMORY=1Gi"]}},
    "sandbox-bad-request": {"annotations": {CRI: "sandbox", "vgpu.io/memory": "lots"}},
    "sandbox-escaped": '{"annotations": {"vgpu.io/memory": "1", '
                       '"io.kubernetes.cri.container-type": "\\u0073andbox"}}',
    "sandbox-key-escaped": '{"annotations": {"vgpu.io/memory": "1", '
                           '"io.kubernetes.cri\\u002econtainer-type": "sandbox"}}',
    "sandbox-last-of-repeated-key": '{"annotations": {"vgpu.io/memory": "1", '
                                    f'"{CRI}": "container", "{CRI}": "sandbox"}}}}',
}


def test_no_vgpud_at_all_passes_a_plain_container_at_once(host):
    b = host.bundle(NOTHING["plain"])
    start = time.monotonic()
    p = host.run("run", "-b", b, "--pid-file", host.tmp / "pid", "c1")
    assert (p.returncode, p.stderr) == (0, "")
    assert time.monotonic() - start < WAIT_S   # no wait for a vgpud that is not there
    assert host.lower.argv() == ["run", "-b", str(b), "--pid-file", str(host.tmp / "pid"), "c1"]


@pytest.mark.parametrize("args", [["state", "c1"], ["start", "c1"], ["kill", "c1", "KILL"],
                                  ["delete", "--force", "c1"], ["--root", "/r", "ps", "c1"],
                                  ["create", "--bundle", "{b}"]],
                         ids=["state", "start", "kill", "delete", "ps", "create-without-id"])
def test_other_commands_pass_through_even_for_a_container_that_asks(host, args):
    b = host.bundle({"annotations": {"vgpu.io/memory": "64Mi"}})
    args = [a.replace("{b}", str(b)) for a in args]
    p = host.run(*args, cwd=b)
    assert (p.returncode, p.stderr) == (0, "")
    assert host.lower.argv() == args


@pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0,
                    reason="needs runc and root")
def test_a_plain_container_runs_on_real_runc(host):
    from support.images import make_bundle

    b = make_bundle(host.tmp / "busybox", args=["/bin/sh", "-c", "echo hello from runc"])
    env = host.env(PATH="/usr/sbin:/usr/bin:/sbin:/bin")   # the real runc, found on PATH
    cid = f"vgpu-native-{os.getpid()}"
    p = run_program([RUNTIME, "--root", host.tmp / "runc-root", "run", "--bundle", b, cid],
                    env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "hello from runc" and p.stderr == ""
    state = run_program([RUNTIME, "--root", host.tmp / "runc-root", "list", "-q"], env)
    assert state.returncode == 0 and cid not in state.stdout   # run removed it: runc's own


# --- specs that may ask need vgpud ------------------------------------------------------------

MAY_ASK = {
    "annotation": {"annotations": {"vgpu.io/memory": "64Mi"}},
    "unknown-vgpu-key": {"annotations": {"vgpu.io/memroy": "64Mi"}},   # vgpud refuses it
    "escaped-key": '{"annotations": {"\\u0076gpu.io\\/memory": "64Mi"}}',
    "escaped-annotations": '{"\\u0061nnotations": {"vgpu.io/memory": "64Mi"}}',
    "env": {"process": {"env": ["PATH=/bin", "VGPU_MEMORY=64Mi"]}},
    "escaped-env": '{"process": {"env": ["\\u0056GPU_MEMORY=64Mi"]}}',
    "duplicate-key": '{"annotations": {"vgpu.io/memory": "1"}, "annotations": {}}',
    "not-json-with-request": '{"annotations": {"vgpu.io/memory": "64Mi"',
    "not-json-with-escape": '{"a": "\\u0076", ',
    "large": {"process": {"env": [f"E{i}={'x' * 100}" for i in range(40_000)] + ["VGPU_COUNT=1"]}},
    # An application container of a pod: vgpud decides (no memory there: no vGPU).
    "cri-container": {"annotations": {CRI: "container", "vgpu.io/priority": "high"}},
    "crio-container": {"annotations": {CRIO: "container", "vgpu.io/memory": "1Gi"}},
    # Not a sandbox as Python's json reads it: the last value or object decides.
    "sandbox-then-container": '{"annotations": {"vgpu.io/memory": "1", '
                              f'"{CRI}": "sandbox", "{CRI}": "container"}}}}',
    "sandbox-in-a-replaced-annotations": f'{{"annotations": {{"{CRI}": "sandbox"}}, '
                                         '"annotations": {"vgpu.io/memory": "1"}}',
    "sandbox-not-a-string": {"annotations": {CRI: ["sandbox"], "vgpu.io/memory": "1"}},
    "sandbox-nested": {"annotations": {"vgpu.io/memory": "1"},
                       "linux": {"annotations": {CRI: "sandbox"}}},
    "sandbox-other-spelling": {"annotations": {CRI: "Sandbox", CRIO: "sandboxes",
                                               "vgpu.io/memory": "1"}},
    "sandbox-other-key": {"annotations": {"io.kubernetes.cri.container-typ": "sandbox",
                                          "vgpu.io/memory": "1"}},
    "sandbox-not-json": '{"annotations": {"vgpu.io/memory": "1", '
                        f'"{CRI}": "sandbox"}}',
}


@pytest.mark.parametrize(("spec", "asks"), [
    *((spec, False) for spec in NOTHING.values()), *((spec, True) for spec in MAY_ASK.values())],
    ids=[*(f"nothing-{k}" for k in NOTHING), *(f"may-ask-{k}" for k in MAY_ASK)])
def test_only_a_spec_that_may_ask_is_sent_to_vgpud(host, spec, asks):
    """The pre-check: specs that ask for nothing never contact vgpud at all."""
    with host.vgpud(ok) as vgpud:
        b = host.bundle(spec)
        p = host.run("create", "--bundle", b, "c1")
    assert (p.returncode, p.stderr) == (0, "")
    assert host.lower.argv() == ["create", "--bundle", str(b), "c1"]
    assert vgpud.requests == ([[("v", "2"), ("op", "runtime-create"), ("bundle", str(b)),
                                ("id", "c1")]] if asks else [])


@pytest.mark.parametrize("spec", [s for s in NOTHING.values() if not isinstance(s, str)
                                  or s.startswith('{"annotations"')],
                         ids=[k for k, s in NOTHING.items() if not isinstance(s, str)
                              or s.startswith('{"annotations"')])
def test_what_the_pre_check_passes_vgpud_would_pass_too(spec):
    """The pre-check is a superset of vgpud's test: no spec it lets by asks in Python."""
    from oci_hook.request import find_request

    doc = json.loads(spec) if isinstance(spec, str) else spec
    annotations = doc.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    env = (doc.get("process") or {}).get("env") or []
    assert find_request(annotations, env, allow_env=True) is None


def test_a_sandbox_passes_through_with_no_vgpud_at_all(host):
    """The pause container of a pod with vgpu.io/* keys: no vgpud contacted, no wait."""
    b = host.bundle(SANDBOX)
    start = time.monotonic()
    p = host.run("--root", host.tmp / "root", "create", "--bundle", b, "sandbox1")
    assert (p.returncode, p.stderr) == (0, "")
    assert time.monotonic() - start < WAIT_S
    assert host.lower.argv() == ["--root", str(host.tmp / "root"), "create", "--bundle", str(b),
                                 "sandbox1"]
    assert json.loads((b / "config.json").read_text()) == SANDBOX   # untouched


def test_without_vgpud_it_fails_within_wait_s_with_one_line(host):
    b = host.bundle(MAY_ASK["annotation"])
    start = time.monotonic()
    p = host.run("create", "--bundle", b, "c1")
    took = time.monotonic() - start
    assert p.returncode == 1 and not host.lower.ran
    assert p.stderr == (f"vgpu: failed to allocate a vGPU: vgpud at {host.lifecycle} did not "
                        f"answer within {WAIT_S}s (is vgpud running?)\n")
    assert WAIT_S <= took < WAIT_S + 2


@pytest.mark.parametrize("log_format", ["json", "text", None])
def test_the_line_also_goes_to_runc_log(host, log_format):
    b = host.bundle(MAY_ASK["env"])
    log = host.tmp / "runc.log"
    fmt = ["--log-format", log_format] if log_format else []
    p = host.run("--log", log, *fmt, "create", "--bundle", b, "c1")
    line = p.stderr.rstrip("\n")
    assert p.returncode == 1 and line.startswith("vgpu: failed to allocate a vGPU: ")
    [entry] = log.read_text().splitlines()
    if log_format == "json":
        record = json.loads(entry)
        assert (record["level"], record["msg"]) == ("error", line)
    else:   # logrus text: time="..." level=error msg="..."
        assert entry.startswith('time="') and f' level=error msg={json.dumps(line)}' in entry


def test_a_refusal_is_reported_and_the_lower_runtime_never_runs(host):
    message = "vgpu: failed to allocate a vGPU: vgpu.io/memory: '64Xi' is not a memory quantity"
    with host.vgpud(lambda r: [("v", "2"), ("status", "error"), ("message", message)]) as vgpud:
        b = host.bundle({"annotations": {"vgpu.io/memory": "64Xi"}})
        p = host.run("--log", host.tmp / "log", "create", "--bundle", b, "c1")
    assert (p.returncode, p.stderr) == (1, message + "\n")
    assert not host.lower.ran and vgpud.ops() == ["runtime-create"]
    assert message.replace("'", "'") in (host.tmp / "log").read_text()


@pytest.mark.parametrize("theirs", [[("v", "1")], []], ids=["v1", "no-version"])
def test_a_vgpud_of_another_version_is_named_with_ours(host, theirs):
    with host.vgpud(lambda r: [*theirs, ("status", "ok")]) as vgpud:
        p = host.run("create", "--bundle", host.bundle(MAY_ASK["annotation"]), "c1")
    assert vgpud.ops() == ["runtime-create"]
    spoken = "v1" if theirs else "no version"
    assert (p.returncode, p.stderr) == (
        1, f"vgpu: vgpu-runtime speaks lifecycle protocol v2; vgpud at {host.lifecycle} "
           f"speaks {spoken}\n")
    assert not host.lower.ran


@pytest.mark.parametrize("argv", [
    ["create", "--bundle", "{b}", "c1"], ["create", "--bundle={b}", "c1"],
    ["--bundle", "{b}", "create", "c1"], ["run", "-b", "rel", "-d", "c1"],
    ["create", "c1"], ["--log-format", "json", "create", "--pid-file", "/p", "--", "c1"]],
    ids=["flag", "flag=value", "before-command", "relative", "cwd", "after-dashes"])
def test_the_bundle_vgpud_gets_is_absolute(host, argv):
    b = host.bundle(MAY_ASK["annotation"], name="rel")
    argv = [a.replace("{b}", str(b)) for a in argv]
    with host.vgpud(ok) as vgpud:
        p = host.run(*argv, cwd=host.tmp if "rel" in argv else b)
    assert (p.returncode, p.stderr) == (0, "")
    assert dict(vgpud.requests[0])["bundle"] == str(b)
    assert dict(vgpud.requests[0])["id"] == "c1"
    assert host.lower.argv() == argv


def test_a_failed_exec_gives_the_slice_back(host):
    broken = host.tmp / "broken-runc"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    host.write_config(f"hook:\n  wait_s: {WAIT_S}\nruntime:\n  lower: {broken}\n")
    with host.vgpud(ok) as vgpud:
        b = host.bundle(MAY_ASK["annotation"])
        p = host.run("create", "--bundle", b, "c1")
    assert p.returncode == 1
    assert p.stderr == (f"vgpu: failed to run the lower runtime: cannot exec {broken}: "
                        "No such file or directory\n")
    assert vgpud.requests[1] == [("v", "2"), ("op", "release"), ("id", "c1"), ("bundle", str(b))]


@pytest.mark.parametrize("how", ["absent", "refusing"])
def test_it_waits_for_a_vgpud_that_is_starting(host, how):
    """vgpud restarting: the socket is missing, or its file is there and refuses."""
    host.write_config("hook:\n  wait_s: 5\n")
    vgpud = host.vgpud(ok)
    if how == "refusing":
        vgpud.bind()
    timer = threading.Timer(0.4, vgpud.listen)
    timer.start()
    try:
        start = time.monotonic()
        p = host.run("create", "--bundle", host.bundle(MAY_ASK["annotation"]), "c1")
        took = time.monotonic() - start
    finally:
        timer.join()
        vgpud.close()
    assert (p.returncode, p.stderr) == (0, "")
    assert 0.35 < took < 4 and vgpud.ops() == ["runtime-create"]


# --- finding the lower runtime ----------------------------------------------------------------

def test_runc_on_path_skips_the_shim_dirs_and_this_program(host):
    """containerd-shim-vgpu-v2's dirs ($VGPU_SHIM_BIN, build/bin/shim) hold vgpu-runtime as
    runc; so may any dir (a link): none of them is the real runc."""
    shim_bin = Recorder(host.tmp / "shim-bin" / "runc")
    links = host.tmp / "links"
    links.mkdir()
    (links / "runc").symlink_to(RUNTIME)
    env = host.env(PATH=f"{NATIVE_BIN / 'shim'}:{shim_bin.path.parent}:{links}:{host.path}",
                   VGPU_SHIM_BIN=str(shim_bin.path.parent))
    p = host.run("state", "c1", env=env)
    assert (p.returncode, p.stderr) == (0, "")
    assert host.lower.argv() == ["state", "c1"] and not shim_bin.ran


def test_the_guard_stops_an_exec_loop(host):
    """A lower runtime that execs vgpu-runtime again (by another name) is caught."""
    loop = host.tmp / "loop" / "runc"
    loop.parent.mkdir()
    loop.write_text(f"#!/bin/sh\nexec {RUNTIME} \"$@\"\n")
    loop.chmod(0o755)
    # The shell script's exec keeps the pid: the marker vgpu-runtime set is seen again.
    p = host.run("state", "c1", env=host.env(PATH=f"{loop.parent}:/usr/bin:/bin"))
    assert p.returncode == 1
    assert p.stderr == f"vgpu: failed to run the lower runtime: {loop} execs this program " \
                       "again (a loop)\n"


@pytest.mark.parametrize(("lower", "line"), [
    ("bin/runc", "vgpu: failed to find the lower runtime 'bin/runc': a path must be absolute"),
    ("/nonexistent/runc", "vgpu: failed to find the lower runtime '/nonexistent/runc': no such "
                          "executable file"),
    ("no-such-runtime", "vgpu: failed to find the lower runtime 'no-such-runtime': not found on "
                        "PATH (set runtime.lower in the vgpu config to its absolute path)"),
    (str(RUNTIME), f"vgpu: failed to find the lower runtime '{RUNTIME}': it is vgpu-runtime "
                   "itself"),
], ids=["relative", "missing", "not-on-path", "itself"])
def test_a_lower_runtime_that_cannot_be_used_is_one_line(host, lower, line):
    host.write_config(f"runtime:\n  lower: {lower}\n")
    p = host.run("--log", host.tmp / "log", "state", "c1")
    assert (p.returncode, p.stderr) == (1, line + "\n")
    assert line in (host.tmp / "log").read_text()


def test_runtime_lower_names_the_program(host):
    other = Recorder(host.tmp / "nvidia" / "nvidia-container-runtime")
    host.write_config(f"---\n# the lower runtime\nruntime:\n  # absolute\n  lower: \"{other.path}\""
                      "   # quoted, with a comment\nhook:\n  wait_s: 1\n")
    p = host.run("state", "c1")
    assert (p.returncode, p.stderr) == (0, "")
    assert other.argv() == ["state", "c1"] and not host.lower.ran


def test_a_missing_config_file_means_the_defaults(host):
    p = host.run("state", "c1", env=host.env(VGPU_CONFIG=str(host.tmp / "none.yaml")))
    assert (p.returncode, p.stderr) == (0, "")
    assert host.lower.argv() == ["state", "c1"]


# --- the config forms the scanner does not read -----------------------------------------------

@pytest.mark.parametrize(("text", "key", "asks"), [
    ("runtime: {lower: runc}\n", "runtime.lower", False),
    ("runtime:\n  lower: &r runc\n", "runtime.lower", False),
    ("runtime:\n\tlower: runc\n", "runtime.lower", False),
    ("runtime:\n  'lower': runc\n", "runtime.lower", False),
    ("hook: {wait_s: 1}\n", "hook.wait_s", True),
    ("hook:\n  wait_s:\n    2\n", "hook.wait_s", True),
    ("paths:\n  socket: \"/run/x\\\\y.sock\"\n", "paths.socket", True),
], ids=["flow", "anchor", "tab", "quoted-key", "flow-hook", "nested-value", "escapes"])
def test_a_yaml_form_it_cannot_read_is_one_line_naming_file_and_key(host, text, key, asks):
    host.write_config(text)
    spec = MAY_ASK["annotation"] if asks else NOTHING["plain"]
    env = host.env()
    env.pop("VGPU_SOCKET")
    p = host.run("create", "--bundle", host.bundle(spec), "c1", env=env)
    assert p.returncode == 1 and not host.lower.ran
    assert p.stderr.startswith(f"vgpu: failed to read config {host.config}: {key}: a YAML form ")
    assert p.stderr.count("\n") == 1


@pytest.mark.parametrize(("text", "line"), [
    ("hook:\n  wait_s: soon\n", "hook.wait_s: 'soon' is not a number of seconds from 0 to 86400"),
    ("hook:\n  wait_s: -1\n", "hook.wait_s: '-1' is not a number of seconds from 0 to 86400"),
    ("paths:\n  socket: run/vgpud.sock\n", "paths.socket: 'run/vgpud.sock' is not an absolute "
                                           "path"),
    ("paths:\n  run_dir: run\n", "paths.run_dir: 'run' is not an absolute path"),
], ids=["wait-word", "wait-negative", "socket-relative", "run-dir-relative"])
def test_a_bad_value_is_one_line(host, text, line):
    host.write_config(text)
    env = host.env()
    env.pop("VGPU_SOCKET")
    p = host.run("create", "--bundle", host.bundle(MAY_ASK["annotation"]), "c1", env=env)
    assert (p.returncode, p.stderr) == (1, f"vgpu: failed to read config {host.config}: {line}\n")


@pytest.mark.parametrize(("text", "env", "where"), [
    ("", {}, "/run/vgpu/vgpud.sock.lifecycle"),
    ("paths:\n  run_dir: /tmp/r  # here\n", {}, "/tmp/r/vgpud.sock.lifecycle"),
    ("paths:\n  run_dir: /tmp/r\n  socket: '/tmp/s.sock'\n", {}, "/tmp/s.sock.lifecycle"),
    ("paths:\n  socket: /tmp/s.sock\n", {"VGPU_SOCKET": "/tmp/env.sock"},
     "/tmp/env.sock.lifecycle"),
    ("paths:\n  socket: /tmp/s.sock\n", {"VGPU_LIFECYCLE_SOCKET": "/tmp/l"}, "/tmp/l"),
], ids=["default", "run-dir", "socket", "env-socket", "env-lifecycle"])
def test_where_it_looks_for_vgpud(host, text, env, where):
    host.write_config(text + "hook:\n  wait_s: 0\n")
    full = host.env(**env)
    if "VGPU_SOCKET" not in env:
        full.pop("VGPU_SOCKET")
    p = host.run("create", "--bundle", host.bundle(MAY_ASK["annotation"]), "c1", env=full)
    assert p.returncode == 1
    assert f"vgpud at {where} did not answer within 0s" in p.stderr


def test_lower_auto_takes_nvidia_s_runtime_where_the_toolkit_is_installed(host):
    """runtime.lower auto: nvidia-container-runtime on PATH wins over runc (it puts the
    driver into the container); without it, runc."""
    nvidia = Recorder(host.tmp / "toolkit" / "nvidia-container-runtime")
    host.write_config("runtime:\n  lower: auto\n")
    p = host.run("state", "c1", env=host.env(PATH=f"{nvidia.path.parent}:{host.path}"))
    assert (p.returncode, p.stderr) == (0, "")
    assert nvidia.argv() == ["state", "c1"] and not host.lower.ran
    p = host.run("state", "c2")
    assert (p.returncode, p.stderr) == (0, "")
    assert host.lower.argv() == ["state", "c2"]


def test_lower_auto_with_neither_runtime_is_one_line(host):
    host.write_config("runtime:\n  lower: auto\n")
    p = host.run("state", "c1", env=host.env(PATH=str(host.tmp / "empty")))
    assert (p.returncode, p.stderr) == (1, (
        "vgpu: failed to find the lower runtime 'auto': neither nvidia-container-runtime nor "
        "runc is on PATH (set runtime.lower in the vgpu config to an absolute path)\n"))


def test_the_lower_runtime_runs_without_the_shim_s_private_dir_on_path(host):
    """containerd-shim-vgpu-v2 puts a dir whose `runc` is vgpu-runtime first on PATH; a
    lower runtime that looks runc up itself (nvidia-container-runtime does) must find the
    real one, so the lower runtime gets PATH without that dir, the rest in order."""
    nvidia = Recorder(host.tmp / "toolkit" / "nvidia-container-runtime", env_names=("PATH",))
    shim_bin = host.tmp / "shim-bin"
    shim_bin.mkdir()
    (shim_bin / "runc").symlink_to(RUNTIME)
    host.write_config("runtime:\n  lower: auto\n")
    path = f"{shim_bin}:{nvidia.path.parent}:{host.path}"
    p = host.run("state", "c1", env=host.env(PATH=path, VGPU_SHIM_BIN=str(shim_bin)))
    assert (p.returncode, p.stderr) == (0, "")
    assert nvidia.argv() == ["state", "c1"]
    assert nvidia.env()["PATH"] == f"{nvidia.path.parent}:{host.path}"
