# SPDX-License-Identifier: Apache-2.0
"""arbiter.config: the YAML file, its JSON Schema, defaults, overrides and error lines."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

import jsonschema
import pytest

from arbiter.config import (
    DEFAULT_CONFIG_PATH,
    RELOADABLE,
    Config,
    config_path,
    load_config,
    schema_path,
)
from arbiter.errors import ConfigError, VgpuError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "vgpu.yaml"
SCHEMA = ROOT / "configs" / "vgpud.schema.json"
MI, GI = 1 << 20, 1 << 30


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# --- defaults and the shipped file ----------------------------------------------------------

def test_defaults_are_the_documented_ones() -> None:
    c = load_config(None)
    assert c == Config()
    assert c.socket == Path("/run/vgpu/vgpud.sock")
    assert c.state_dir == Path("/var/lib/vgpu")
    assert c.run_dir == Path("/run/vgpu")
    assert c.event_log == Path("/var/lib/vgpu/events.jsonl")
    assert (c.placement_policy, c.allow_preemption) == ("binpack", False)
    assert (c.default_compute, c.default_priority, c.default_policy) == (10, "normal", "fixed")
    assert (c.context_reserve, c.priority_floor) == (0, 0)
    assert (c.reconcile_interval_s, c.drift_action) == (10.0, "flag")
    assert (c.guard_action, c.guard_margin, c.guard_interval_s, c.cgroup_root) == \
        ("throttle", 10, 0.5, None)
    assert c.metrics_address == "127.0.0.1:9400"
    assert c.devices_include is None and dict(c.device_nodes) == {}
    assert c.runtime_state_roots == (
        Path("/run/runc"), Path("/run/containerd/runc"), Path("/run/docker/runtime-runc"))
    assert (c.hook_wait_s, c.allow_env_requests, c.nvml_library) == (10.0, True, None)
    assert c.cdi_spec_dirs == (Path("/etc/cdi"), Path("/var/run/cdi"))
    assert c.source is None


def test_shipped_file_equals_builtin_defaults() -> None:
    shipped = load_config(SHIPPED, required=True)
    assert shipped == load_config(None)
    assert shipped.source == SHIPPED


def test_shipped_file_documents_every_key() -> None:
    """Each key of every section in the schema appears in configs/vgpu.yaml after a comment."""
    schema = json.loads(SCHEMA.read_text())
    lines = SHIPPED.read_text().splitlines()
    for section, sub in schema["properties"].items():
        assert f"{section}:" in lines, f"section {section} missing from {SHIPPED.name}"
        start = lines.index(f"{section}:")
        for key in sub["properties"]:
            matches = [i for i, line in enumerate(lines[start:], start)
                       if line.startswith(f"  {key}:")]
            assert matches, f"{section}.{key} missing from {SHIPPED.name}"
            assert lines[matches[0] - 1].lstrip().startswith("#"), \
                f"{section}.{key} has no comment above it"


def test_schema_is_valid_draft_2020_12_and_closed() -> None:
    schema = json.loads(SCHEMA.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema_path() == SCHEMA

    def closed(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "propertyNames" not in node:
                assert node.get("additionalProperties") is False, f"{where} is open"
            for k, v in node.items():
                closed(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                closed(v, f"{where}/{i}")

    closed(schema, "#")


def test_missing_file_is_an_error_unless_the_default_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"  # named on purpose (--config, VGPU_CONFIG): a typo
    with pytest.raises(ConfigError, match=rf"^failed to load config {missing}: no such file$"):
        load_config(missing)
    assert load_config(missing, required=False) == Config()
    # Only the default path stands for the built-in defaults when it is missing.
    assert load_config(missing, default_path=missing) == Config()
    with pytest.raises(ConfigError, match="no such file"):
        load_config(missing, required=True, default_path=missing)


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n", "---\n"],
                         ids=["empty", "comment-only", "empty-document"])
def test_empty_file_gives_defaults(tmp_path: Path, text: str) -> None:
    assert load_config(write(tmp_path, text)) == Config()


# --- happy cases ----------------------------------------------------------------------------

HAPPY = [
    pytest.param("placement: {policy: spread, allow_preemption: true}",
                 {"placement_policy": "spread", "allow_preemption": True}, id="placement"),
    pytest.param("defaults: {compute: 2, priority: high, policy: burst}",
                 {"default_compute": 2, "default_priority": "high", "default_policy": "burst"},
                 id="defaults-edges-low"),
    pytest.param("defaults: {compute: 100}", {"default_compute": 100}, id="compute-100"),
    pytest.param("defaults: {priority_floor: 0}", {"priority_floor": 0}, id="floor-0"),
    pytest.param("defaults: {priority_floor: 5}", {"priority_floor": 5}, id="floor-5"),
    pytest.param("defaults: {priority_floor: 100}", {"priority_floor": 100}, id="floor-100"),
    pytest.param("defaults: {context_reserve: 256Mi}", {"context_reserve": 256 * MI},
                 id="reserve-binary"),
    pytest.param("defaults: {context_reserve: 1G}", {"context_reserve": 10**9},
                 id="reserve-decimal"),
    pytest.param("defaults: {context_reserve: 64}", {"context_reserve": 64 * MI},
                 id="reserve-bare-int-is-mib"),
    pytest.param("defaults: {context_reserve: '64'}", {"context_reserve": 64 * MI},
                 id="reserve-bare-string-is-mib"),
    pytest.param("defaults: {context_reserve: '0'}", {"context_reserve": 0}, id="reserve-0"),
    pytest.param("reconcile: {interval_s: 0.5, drift_action: kill}",
                 {"reconcile_interval_s": 0.5, "drift_action": "kill"}, id="reconcile"),
    pytest.param("reconcile: {interval_s: 3}", {"reconcile_interval_s": 3.0},
                 id="interval-int-becomes-float"),
    pytest.param("reconcile: {runtime_state_roots: [/a, /b/c]}",
                 {"runtime_state_roots": (Path("/a"), Path("/b/c"))}, id="state-roots"),
    pytest.param("reconcile: {runtime_state_roots: []}", {"runtime_state_roots": ()},
                 id="no-state-roots"),
    pytest.param("guard: {action: kill, margin_percent: 5, interval_s: 0.25, "
                 "cgroup_root: /sys/fs/cgroup/unified}",
                 {"guard_action": "kill", "guard_margin": 5, "guard_interval_s": 0.25,
                  "cgroup_root": Path("/sys/fs/cgroup/unified")}, id="guard"),
    pytest.param("guard: {action: flag, interval_s: 1}",
                 {"guard_action": "flag", "guard_interval_s": 1.0}, id="guard-flag"),
    pytest.param("guard: {memory_escalate_after: 0, memory_escalate_window_s: 5, "
                 "memory_escalate_action: freeze}",
                 {"guard_memory_escalate_after": 0, "guard_memory_escalate_window_s": 5.0,
                  "guard_memory_escalate_action": "freeze"}, id="guard-escalate"),
    pytest.param("metrics: {address: ''}", {"metrics_address": ""}, id="metrics-off"),
    pytest.param("metrics: {address: '0.0.0.0:0'}", {"metrics_address": "0.0.0.0:0"},
                 id="metrics-any-port"),
    pytest.param("metrics: {address: '[::1]:9400'}", {"metrics_address": "[::1]:9400"},
                 id="metrics-ipv6"),
    pytest.param("metrics: {address: 'gpu-host.example:9400'}",
                 {"metrics_address": "gpu-host.example:9400"}, id="metrics-hostname"),
    pytest.param("devices: {include: [1, '0', GPU-0469b75f-2fa8]}",
                 {"devices_include": (1, 0, "GPU-0469b75f-2fa8")}, id="include-mixed"),
    pytest.param("devices: {include: null}", {"devices_include": None}, id="include-null"),
    pytest.param("devices:\n  nodes:\n    0: [/dev/null]\n    '*': [/dev/zero, /dev/full]\n",
                 {"device_nodes": {0: ("/dev/null",), -1: ("/dev/zero", "/dev/full")}},
                 id="nodes-index-and-star"),
    pytest.param("hook: {wait_s: 2.5, allow_env_requests: false}",
                 {"hook_wait_s": 2.5, "allow_env_requests": False}, id="hook"),
    pytest.param("runtime: {cdi_spec_dirs: [/srv/cdi]}", {"cdi_spec_dirs": (Path("/srv/cdi"),)},
                 id="cdi-dirs"),
    pytest.param("requests:\n  trusted_sources:\n    pod_annotations: {ml-batch: [priority]}\n"
                 "    pod_env: {'*': [memory, compute]}\n",
                 {"trusted_pod_annotations": {"ml-batch": ("priority",)},
                  "trusted_pod_env": {"*": ("memory", "compute")}}, id="trusted-sources"),
    pytest.param("nvml: {library: /opt/simgpu/libnvidia-ml.so.1}",
                 {"nvml_library": Path("/opt/simgpu/libnvidia-ml.so.1")}, id="nvml-library"),
    pytest.param("paths: {socket: /tmp/s.sock, state_dir: /tmp/st, run_dir: /tmp/run, "
                 "event_log: /tmp/ev.jsonl, lib_dir: /tmp/lib}",
                 {"socket": Path("/tmp/s.sock"), "state_dir": Path("/tmp/st"),
                  "run_dir": Path("/tmp/run"), "event_log": Path("/tmp/ev.jsonl"),
                  "lib_dir": Path("/tmp/lib")},
                 id="paths-all"),
    pytest.param("paths: {state_dir: /srv/vgpu, run_dir: /tmp/r}",
                 {"state_dir": Path("/srv/vgpu"), "event_log": Path("/srv/vgpu/events.jsonl"),
                  "lib_dir": Path("/srv/vgpu/lib"),
                  "run_dir": Path("/tmp/r"), "socket": Path("/tmp/r/vgpud.sock")},
                 id="derived-paths-follow"),
    pytest.param("placement:\n  allow_preemption: yes\n", {"allow_preemption": True},
                 id="yaml11-yes-is-true"),
]


@pytest.mark.parametrize(("text", "expected"), HAPPY)
def test_happy(tmp_path: Path, text: str, expected: dict[str, object]) -> None:
    c = load_config(write(tmp_path, text))
    for name, value in expected.items():
        assert getattr(c, name) == value, name
    # Whatever was not set stays at its default.
    untouched = {f for f in Config.__dataclass_fields__ if f not in expected} - {
        "source", "socket", "event_log"}
    for name in untouched:
        assert getattr(c, name) == getattr(Config(), name), name


# --- sad cases: one line naming file, line, key, value and why ---------------------------------

SAD = [
    pytest.param("placement:\n  policy: fast\n",
                 "line 2: placement.policy: 'fast' is not one of ['binpack', 'spread']",
                 id="enum"),
    pytest.param("placement:\n  polcy: binpack\n",
                 "line 2: placement.polcy: unknown key (expected one of: allow_preemption, "
                 "policy)", id="unknown-key"),
    pytest.param("# top\nbogus: 1\n", "line 2: bogus: unknown key (expected one of: broker, "
                 "defaults, devices, events, guard, hook, metrics, nvml, paths, placement, "
                 "reconcile, requests, runtime)",
                 id="unknown-section"),
    pytest.param("placement: [binpack]\n", "line 1: placement: ['binpack'] is not a mapping of "
                 "keys", id="section-not-mapping"),
    pytest.param("placement:\n  allow_preemption: maybe\n",
                 "line 2: placement.allow_preemption: 'maybe' is not true or false",
                 id="not-bool"),
    pytest.param("defaults:\n  compute: 1\n",
                 "line 2: defaults.compute: 1 is not an integer percent from 2 to 100",
                 id="compute-too-low"),
    pytest.param("defaults:\n  compute: 101\n",
                 "line 2: defaults.compute: 101 is not an integer percent from 2 to 100",
                 id="compute-too-high"),
    pytest.param("defaults:\n  compute: '50'\n",
                 "line 2: defaults.compute: '50' is not an integer percent from 2 to 100",
                 id="compute-string"),
    pytest.param("defaults:\n  compute: 12.5\n",
                 "line 2: defaults.compute: 12.5 is not an integer percent from 2 to 100",
                 id="compute-float"),
    pytest.param("defaults:\n  priority_floor: 101\n",
                 "line 2: defaults.priority_floor: 101 is not an integer percent from 0 to 100",
                 id="floor-too-high"),
    pytest.param("defaults:\n  priority_floor: -1\n",
                 "line 2: defaults.priority_floor: -1 is not an integer percent from 0 to 100",
                 id="floor-negative"),
    pytest.param("defaults:\n  priority_floor: 2.5\n",
                 "line 2: defaults.priority_floor: 2.5 is not an integer percent from 0 to 100",
                 id="floor-float"),
    pytest.param("defaults:\n  priority: urgent\n",
                 "line 2: defaults.priority: 'urgent' is not one of ['low', 'normal', 'high']",
                 id="priority"),
    pytest.param("defaults:\n  context_reserve: 12X\n",
                 "line 2: defaults.context_reserve: '12X' is not 0 or a memory quantity: an "
                 "integer with an optional suffix", id="reserve-bad-suffix"),
    pytest.param("defaults:\n  context_reserve: -3\n",
                 "line 2: defaults.context_reserve: -3 is not 0 or a memory quantity",
                 id="reserve-negative"),
    pytest.param("defaults:\n  context_reserve: [1]\n",
                 "line 2: defaults.context_reserve: [1] is not 0 or a memory quantity",
                 id="reserve-list"),
    pytest.param("reconcile:\n  interval_s: 0\n",
                 "line 2: reconcile.interval_s: 0 is not a number of seconds above 0",
                 id="interval-zero"),
    pytest.param("reconcile:\n  drift_action: warn\n",
                 "line 2: reconcile.drift_action: 'warn' is not one of ['flag', 'kill']",
                 id="drift-action"),
    pytest.param("guard:\n  action: freeze\n",
                 "line 2: guard.action: 'freeze' is not one of ['flag', 'kill', 'throttle']",
                 id="guard-action"),
    pytest.param("guard:\n  interval_s: 2\n",
                 "line 2: guard.interval_s: 2 is not a number of seconds above 0 and at most 1",
                 id="guard-interval"),
    pytest.param("guard:\n  margin_percent: 101\n",
                 "line 2: guard.margin_percent: 101 is not an integer percent from 0 to 100",
                 id="guard-margin"),
    pytest.param("guard:\n  memory_escalate_action: flag\n",
                 "line 2: guard.memory_escalate_action: 'flag' is not one of ['freeze', 'kill']",
                 id="guard-escalate-action"),
    pytest.param("guard:\n  memory_escalate_after: -1\n",
                 "line 2: guard.memory_escalate_after: -1 is not an integer count of findings, "
                 "0 or more (0: never escalate)", id="guard-escalate-after"),
    pytest.param("guard:\n  memory_escalate_window_s: 0\n",
                 "line 2: guard.memory_escalate_window_s: 0 is not a number of seconds above 0",
                 id="guard-escalate-window"),
    pytest.param("guard:\n  cgroup_root: sys/fs/cgroup\n",
                 "line 2: guard.cgroup_root: 'sys/fs/cgroup' is not an absolute path",
                 id="guard-cgroup-root"),
    pytest.param("reconcile:\n  runtime_state_roots:\n    - /run/runc\n    - run/x\n",
                 "line 4: reconcile.runtime_state_roots[1]: 'run/x' is not an absolute path",
                 id="relative-root"),
    pytest.param("metrics:\n  address: localhost\n",
                 "line 2: metrics.address: 'localhost' is not HOST:PORT", id="address-no-port"),
    pytest.param("metrics:\n  address: 'h:70000'\n",
                 "line 2: metrics.address: 'h:70000' has a port above 65535", id="address-port"),
    pytest.param("metrics:\n  address: 9400\n",
                 "line 2: metrics.address: 9400 is not HOST:PORT", id="address-int"),
    pytest.param("devices:\n  include: []\n",
                 "line 2: devices.include: the list must not be empty", id="include-empty"),
    pytest.param("devices:\n  include: [0, 0]\n",
                 "line 2: devices.include: [0, 0] has duplicate items", id="include-dup"),
    pytest.param("devices:\n  include: [first]\n",
                 "line 2: devices.include[0]: 'first' is not a GPU index or UUID (GPU-...)",
                 id="include-bad-item"),
    pytest.param("devices:\n  include: [-1]\n",
                 "line 2: devices.include[0]: -1 is not a GPU index or UUID (GPU-...)",
                 id="include-negative"),
    pytest.param("devices:\n  include: 0\n",
                 "line 2: devices.include: 0 is not null (all GPUs) or a non-empty list",
                 id="include-scalar"),
    pytest.param("requests:\n  trusted_sources:\n    pod_annotations: {Team_A: [priority]}\n",
                 "line 3: requests.trusted_sources.pod_annotations.Team_A: unknown key: "
                 "expected a Kubernetes namespace name, or * for every namespace",
                 id="trusted-bad-namespace"),
    pytest.param("requests:\n  trusted_sources:\n    pod_env: {ml: [prio]}\n",
                 "line 3: requests.trusted_sources.pod_env.ml[0]: 'prio' is not one of "
                 "['memory', 'compute', 'count', 'priority', 'policy', 'devices']",
                 id="trusted-bad-key"),
    pytest.param("requests:\n  trusted_sources:\n    pod: {}\n",
                 "line 3: requests.trusted_sources.pod: unknown key (expected one of: "
                 "pod_annotations, pod_env)", id="trusted-bad-source"),
    pytest.param("devices:\n  nodes:\n    x: [/dev/null]\n",
                 "line 3: devices.nodes.x: unknown key: expected a GPU index or '*'",
                 id="nodes-bad-key"),
    pytest.param("devices:\n  nodes:\n    0: /dev/null\n",
                 "line 3: devices.nodes.0: '/dev/null' is not a list", id="nodes-not-list"),
    pytest.param("devices:\n  nodes:\n    0: [dev/null]\n",
                 "line 3: devices.nodes.0[0]: 'dev/null' is not an absolute path",
                 id="nodes-relative"),
    pytest.param("hook:\n  wait_s: -1\n", "line 2: hook.wait_s: -1 is not a number of seconds",
                 id="wait-negative"),
    pytest.param("hook:\n  wait_s: true\n", "line 2: hook.wait_s: True is not a number",
                 id="wait-bool"),
    pytest.param("runtime:\n  cdi_spec_dirs:\n    - /etc/cdi\n    - var/run/cdi\n",
                 "line 4: runtime.cdi_spec_dirs[1]: 'var/run/cdi' is not an absolute path",
                 id="cdi-dir-relative"),
    pytest.param("runtime:\n  cdi_spec_dirs: []\n",
                 "line 2: runtime.cdi_spec_dirs: the list must not be empty", id="cdi-dirs-empty"),
    pytest.param("runtime:\n  cdi_spec_dirs: /var/run/cdi\n",
                 "line 2: runtime.cdi_spec_dirs: '/var/run/cdi' is not a list",
                 id="cdi-dirs-scalar"),
    pytest.param("runtime:\n  cdi_spec_dirs: [/etc/cdi, /etc/cdi]\n",
                 "line 2: runtime.cdi_spec_dirs: ['/etc/cdi', '/etc/cdi'] has duplicate items",
                 id="cdi-dirs-dup"),
    pytest.param("nvml:\n  library: libnvidia-ml.so.1\n",
                 "line 2: nvml.library: 'libnvidia-ml.so.1' is not an absolute path",
                 id="library-relative"),
    pytest.param("paths:\n  socket: ''\n", "line 2: paths.socket: '' is not", id="socket-empty"),
    pytest.param("paths:\n  state_dir: null\n", "line 2: paths.state_dir: None is not an "
                 "absolute path", id="state-dir-null"),
    pytest.param("placement:\n  policy: binpack\nplacement:\n  policy: spread\n",
                 "line 3: placement: duplicate key", id="duplicate-section"),
    pytest.param("placement:\n  policy: binpack\n  policy: spread\n",
                 "line 3: placement.policy: duplicate key", id="duplicate-key"),
    pytest.param("placement:\n  policy: [binpack\n", "line 3: invalid YAML: expected ',' or ']'",
                 id="yaml-syntax"),
    pytest.param("a: b: c\n", "line 1: invalid YAML: mapping values are not allowed here",
                 id="yaml-mapping-value"),
    pytest.param("- paths\n- placement\n", "line 1: expected a mapping of sections",
                 id="top-level-list"),
    pytest.param("just text\n", "line 1: expected a mapping of sections (paths:, placement:, "
                 "...), got 'just text'", id="top-level-scalar"),
    pytest.param("x: 1\ny: 2\nplacement: {policy: nope}\n",
                 "line 1: x: unknown key (expected one of:", id="several-first-wins"),
]


@pytest.mark.parametrize(("text", "message"), SAD)
def test_sad(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text_ = str(info.value)
    assert text_.startswith(f"failed to load config {path}: {message}"), text_
    assert "\n" not in text_
    assert isinstance(info.value, VgpuError)
    assert info.value.path == path


def test_several_problems_are_counted(tmp_path: Path) -> None:
    path = write(tmp_path, "x: 1\ny: 2\nplacement: {policy: nope}\n")
    with pytest.raises(ConfigError, match=r"\(and 2 more problems\)$") as info:
        load_config(path)
    assert (info.value.line, info.value.key) == (1, "x")


def test_error_attributes(tmp_path: Path) -> None:
    path = write(tmp_path, "# comment\n\ndefaults:\n  compute: 200\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    e = info.value
    assert (e.path, e.line, e.key) == (path, 4, "defaults.compute")
    assert e.reason == "200 is not an integer percent from 2 to 100"


def _load_as_nobody(path: Path) -> str:
    """load_config(path) in a forked child that dropped root for nobody (root reads any
    file); what it raised, or "loaded"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                load_config(path)
                msg = "loaded"
            except ConfigError as e:
                msg = str(e)
        except BaseException as e:  # (whatever it is, the parent says it)
            msg = f"child failed: {e!r}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    return msg


def test_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        path = write(tmp_path, "placement: {}\n")
        path.chmod(0)
        with pytest.raises(ConfigError, match=r": cannot read the file: Permission denied$"):
            load_config(path)
        return
    # Root reads any file: the load runs as nobody, in a directory it may enter (pytest's
    # tmp_path is root's alone), so only the file's own mode stops it.
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        d.chmod(0o755)
        path = write(d, "placement: {}\n")
        path.chmod(0)
        msg = _load_as_nobody(path)
        denied = r"^failed to load config .*: cannot read the file: Permission denied$"
        assert re.search(denied, msg), msg
    finally:
        shutil.rmtree(d)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^failed to load config {tmp_path}: cannot read the "
                       r"file: Is a directory$"):
        load_config(tmp_path)


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"^failed to load config .*: (cannot read the file|"
                       r"invalid YAML)"):
        load_config(path)


# --- overrides ------------------------------------------------------------------------------

def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "paths: {socket: /a/s.sock, state_dir: /a/state, run_dir: /a/run}\n")
    c = load_config(path, {"socket": str(tmp_path / "s.sock"), "state_dir": tmp_path / "st",
                           "run_dir": None})
    assert c.socket == tmp_path / "s.sock"
    assert c.state_dir == tmp_path / "st"
    assert c.run_dir == Path("/a/run")                 # None: not given on the command line
    assert c.event_log == tmp_path / "st" / "events.jsonl"


def test_run_dir_override_moves_default_socket(tmp_path: Path) -> None:
    c = load_config(None, {"run_dir": str(tmp_path)})
    assert c.socket == tmp_path / "vgpud.sock"
    assert c.run_dir == tmp_path


def test_relative_override_is_made_absolute(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(None, {"state_dir": "st"}).state_dir == tmp_path / "st"


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'sockett' given on the command line"):
        load_config(None, {"sockett": "/x"})


# --- helpers --------------------------------------------------------------------------------

@pytest.mark.parametrize(("explicit", "env", "expected"), [
    pytest.param("/x.yaml", {"VGPU_CONFIG": "/y.yaml"}, Path("/x.yaml"), id="flag-wins"),
    pytest.param(None, {"VGPU_CONFIG": "/y.yaml"}, Path("/y.yaml"), id="env"),
    pytest.param(None, {}, DEFAULT_CONFIG_PATH, id="default"),
    pytest.param(None, {"VGPU_CONFIG": ""}, DEFAULT_CONFIG_PATH, id="empty-env"),
])
def test_config_path(explicit: str | None, env: dict[str, str], expected: Path) -> None:
    assert config_path(explicit, env) == expected


def test_replace_reloadable(tmp_path: Path) -> None:
    old = load_config(None, {"state_dir": str(tmp_path)})
    new = load_config(write(tmp_path, """\
        placement: {policy: spread, allow_preemption: true}
        defaults: {compute: 20, priority: low, policy: burst, context_reserve: 1Gi,
                   priority_floor: 30}
        reconcile: {interval_s: 1, drift_action: kill}
        guard: {action: flag, margin_percent: 20, memory_action: flag, memory_margin: 0,
                memory_escalate_after: 5, memory_escalate_window_s: 30,
                memory_escalate_action: freeze}
        metrics: {address: ''}
        """))
    merged = old.replace_reloadable(new)
    for name in RELOADABLE:
        assert getattr(merged, name) == getattr(new, name), name
    assert merged.state_dir == tmp_path                 # not reloadable: kept
    assert merged.metrics_address == "127.0.0.1:9400"
    assert merged.context_reserve == 0
    assert set(old.unreloadable_changes(new)) == {"state_dir", "event_log", "lib_dir",
                                                  "metrics_address", "context_reserve"}
    assert set(old.changed(new)) == RELOADABLE | set(old.unreloadable_changes(new))


def test_reloadable_names_are_fields() -> None:
    assert set(RELOADABLE) <= set(Config.__dataclass_fields__)


def test_nodes_for() -> None:
    real = Config()
    assert real.nodes_for(1, 3) == ("/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                    "/dev/nvidia-uvm-tools")
    sim = Config(device_nodes={0: ("/dev/null",), -1: ("/dev/zero",)})
    assert sim.nodes_for(0, 0) == ("/dev/null",)
    assert sim.nodes_for(1, 1) == ("/dev/zero",)


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().socket = Path("/x")  # type: ignore[misc]
