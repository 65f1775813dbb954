# SPDX-License-Identifier: Apache-2.0
"""vgpud's configuration: /etc/vgpu/config.yaml, checked against configs/vgpud.schema.json.

The file is YAML with one section per concern (paths, placement, defaults,
reconcile, guard, metrics, devices, hook, nvml, runtime); `Config` flattens it into one frozen
dataclass. Every key is optional and defaults to the value documented in
configs/vgpu.yaml. Any problem (unreadable file, bad YAML, unknown key, wrong
value) raises ConfigError with one line that names the file, the line, the
key path, the value and the reason, e.g.

    failed to load config /etc/vgpu/config.yaml: line 7: placement.policy:
    'fast' is not one of ['binpack', 'spread']
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from arbiter.defaults import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_LOWER_RUNTIME,
    DEFAULT_RUN_DIR,
    DEFAULT_SOCKET,
    DEFAULT_WAIT_S,
    ENV_CONFIG,
    SOCKET_NAME,
)
from arbiter.errors import ConfigError, QuantityError
from arbiter.install.shipped import shipped_file
from arbiter.quantity import MEMORY_FORMS, parse_memory

if TYPE_CHECKING:
    import jsonschema

__all__ = [
    "DEFAULT_CDI_SPEC_DIRS",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_DEVICE_NODES",
    "RELOADABLE",
    "Accepted",
    "Config",
    "config_path",
    "document_digest",
    "load_config",
    "schema_path",
]

#: Device nodes of a real GPU besides its own /dev/nvidia<minor> (inventory adds that one).
DEFAULT_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

#: Where CDI specs are looked up (containerd, CRI-O and Podman read these by default; the
#: DRA plugin writes a claim's spec in the last): config runtime.cdi_spec_dirs.
DEFAULT_CDI_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))

#: Fields a SIGHUP may change in a running vgpud; the rest need a restart.
RELOADABLE = frozenset({
    "placement_policy",
    "allow_preemption",
    "default_compute",
    "default_priority",
    "default_policy",
    "priority_floor",
    "reconcile_interval_s",
    "drift_action",
    "guard_action",
    "guard_margin",
    "guard_memory_action",
    "guard_memory_margin",
    "guard_memory_escalate_after",
    "guard_memory_escalate_window_s",
    "guard_memory_escalate_action",
})

_SCHEMA_NAME = "vgpud.schema.json"
_PATH_FIELDS = frozenset({"socket", "state_dir", "run_dir", "event_log", "nvml_library",
                          "cgroup_root", "lib_dir"})


@dataclass(frozen=True)
class Config:
    """The validated configuration of one host; field defaults are the built-in defaults."""

    socket: Path = DEFAULT_SOCKET
    state_dir: Path = Path("/var/lib/vgpu")
    run_dir: Path = DEFAULT_RUN_DIR
    event_log: Path = Path("/var/lib/vgpu/events.jsonl")
    #: The event log is rotated before it passes this many bytes, keeping this many older
    #: files (<event_log>.1 ...): at most (generations + 1) x max bytes on disk.
    event_log_max_bytes: int = 10 << 20
    event_log_generations: int = 3
    #: Versioned installs of libvgpu.so and the programs (arbiter.install.versions).
    lib_dir: Path = Path("/var/lib/vgpu/lib")
    placement_policy: str = "binpack"
    allow_preemption: bool = False
    default_compute: int = 10
    default_priority: str = "normal"
    default_policy: str = "fixed"
    priority_floor: int = 0                        # % of the GPU, 0..100
    context_reserve: int = 0                       # bytes
    reconcile_interval_s: float = 10.0
    drift_action: str = "flag"
    guard_action: str = "throttle"                 # flag | kill | throttle (compute_guard)
    guard_margin: int = 10                         # percentage points above the share
    guard_interval_s: float = 0.5
    guard_memory_action: str = "kill"              # flag | kill | throttle (memory_guard)
    guard_memory_margin: int = 128 << 20           # bytes per slice above the memory limit
    guard_memory_escalate_after: int = 3           # memory findings that stop the slice (0: never)
    guard_memory_escalate_window_s: float = 60.0   # ... within this many seconds
    guard_memory_escalate_action: str = "kill"     # freeze | kill (arbiter.compute.memory_guard)
    cgroup_root: Path | None = None                # None: find the cgroup v2 mount
    metrics_address: str = "127.0.0.1:9400"        # '' disables the endpoint
    devices_include: tuple[int | str, ...] | None = None   # None: every GPU NVML reports
    # GPU index -> host device nodes that replace the real defaults for that GPU;
    # key -1 stands for '*' in the file (every GPU without its own entry).
    device_nodes: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    runtime_state_roots: tuple[Path, ...] = (
        Path("/run/runc"), Path("/run/containerd/runc"), Path("/run/docker/runtime-runc"))
    hook_wait_s: float = DEFAULT_WAIT_S
    #: How long vgpu-broker keeps serving without a live vgpud (0: for good).
    broker_orphan_s: float = 300.0
    allow_env_requests: bool = True
    #: requests.trusted_sources (oci_hook.trust): per namespace ('*': every one), the
    #: request keys (short names: memory, priority, ...) that a Kubernetes pod's own
    #: annotations, and its containers' VGPU_* env, may set. Empty: none.
    trusted_pod_annotations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    trusted_pod_env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    nvml_library: Path | None = None
    #: OCI runtime vgpu-runtime execs: a name searched on PATH, or an absolute path.
    runtime_lower: str = DEFAULT_LOWER_RUNTIME
    #: Where vgpud's runtime-create finds a claim's CDI spec (containerd 1.6 has no CDI);
    #: a later directory's spec wins, as in CDI.
    cdi_spec_dirs: tuple[Path, ...] = DEFAULT_CDI_SPEC_DIRS
    #: The file this config came from (None: built-in defaults); not part of equality.
    source: Path | None = field(default=None, compare=False)

    def replace_reloadable(self, new: Config) -> Config:
        """Return this config with the SIGHUP-reloadable fields taken from `new`."""
        return dataclasses.replace(self, **{name: getattr(new, name) for name in RELOADABLE})

    def changed(self, new: Config) -> tuple[str, ...]:
        """Names of the fields whose values differ in `new`, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self)
                     if f.compare and getattr(self, f.name) != getattr(new, f.name))

    def unreloadable_changes(self, new: Config) -> tuple[str, ...]:
        """Fields that differ in `new` but only take effect after a restart."""
        return tuple(name for name in self.changed(new) if name not in RELOADABLE)

    def nodes_for(self, index: int, minor: int) -> tuple[str, ...]:
        """Host device nodes for GPU `index` (minor number `minor`): config entry or real ones."""
        if index in self.device_nodes:
            return self.device_nodes[index]
        if -1 in self.device_nodes:
            return self.device_nodes[-1]
        return (f"/dev/nvidia{minor}", *DEFAULT_DEVICE_NODES)


def config_path(explicit: str | Path | None = None,
                environ: Mapping[str, str] = os.environ) -> Path:
    """The config file to read: --config, else $VGPU_CONFIG, else /etc/vgpu/config.yaml.

    Only the last may be missing (load_config then gives the built-in defaults)."""
    if explicit:
        return Path(explicit)
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG])
    return DEFAULT_CONFIG_PATH


def schema_path() -> Path:
    """Where configs/vgpud.schema.json is: inside an installed package, else in the checkout."""
    return shipped_file(_SCHEMA_NAME)


class Accepted(Protocol):
    """Digests of documents the schema accepted before (arbiter.daemon.configmemo keeps vgpud's):
    load_config skips jsonschema for those."""

    def __contains__(self, digest: object) -> bool: ...

    def add(self, digest: str) -> None:
        """Record a digest whose document the schema accepted."""


def document_digest(document: Any) -> str:
    """What a config document's schema check depends on: the schema file and the document."""
    h = hashlib.sha256(schema_path().read_bytes())
    h.update(b"\0" + json.dumps(document, sort_keys=True).encode())
    return h.hexdigest()


@cache
def _validator() -> jsonschema.protocols.Validator:
    # Imported here: ~90 ms that a vgpud restart with an accepted config never pays.
    import jsonschema

    path = schema_path()
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(path, f"cannot read the config schema: {e}") from e
    # The schema itself is checked by tests/arbiter/test_config.py, not on every load:
    # check_schema costs ~30 ms, paid by every container start (runtime and hook).
    cls = jsonschema.validators.validator_for(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def load_config(path: Path | None, overrides: Mapping[str, object] = {},
                *, required: bool | None = None,
                default_path: Path = DEFAULT_CONFIG_PATH,
                accepted: Accepted | None = None) -> Config:
    """Load and validate `path` (None: built-in defaults) and apply overrides.

    `overrides` maps Config field names to values that win over the file (vgpud's
    --socket, --state-dir, --run-dir); None values are ignored. A missing file is an
    error unless it is DEFAULT_CONFIG_PATH, which stands for the built-in defaults:
    any other path was named on purpose (--config, VGPU_CONFIG, a client's config
    passed on by the compiled runtime), and silently running on defaults would hide
    the typo. `required` True or False makes a missing file an error or the defaults
    whatever its path; `default_path` is the path that stands for the defaults.
    A document whose digest is in `accepted` is not checked against the schema again;
    one that passes the check is added to it.
    """
    document: Any = {}
    tree: yaml.Node | None = None
    if path is not None:
        if required is None:
            required = Path(path) != default_path
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as e:
            if required:
                raise ConfigError(path, "no such file") from e
            text = ""
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ConfigError(path, f"cannot read the file: {reason}") from e
        document, tree = _parse_yaml(path, text)
    return _build(path, document, tree, overrides, accepted)


def _parse_yaml(path: Path, text: str) -> tuple[Any, yaml.Node | None]:
    """The document as Python data plus its node tree (for line numbers)."""
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = e.problem or e.context or "syntax error"
        raise ConfigError(path, f"invalid YAML: {problem}", line=line) from e
    except yaml.YAMLError as e:
        raise ConfigError(path, f"invalid YAML: {e}".replace("\n", " ")) from e
    if document is None:
        return {}, None
    if not isinstance(document, dict):
        line = tree.start_mark.line + 1 if tree is not None else None
        raise ConfigError(path, f"expected a mapping of sections (paths:, placement:, ...), "
                          f"got {_describe(document)}", line=line)
    return document, tree


class _Lines:
    """Line numbers of keys and values in the YAML node tree, by key path."""

    def __init__(self, tree: yaml.Node | None) -> None:
        self.keys: dict[tuple[str | int, ...], int] = {}
        self.values: dict[tuple[str | int, ...], int] = {}
        self.duplicates: list[tuple[tuple[str | int, ...], int]] = []
        if tree is not None:
            self._walk(tree, ())

    def _walk(self, node: yaml.Node, path: tuple[str | int, ...]) -> None:
        self.values[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else repr(key.value)
                child = (*path, name)
                if child in self.keys:
                    self.duplicates.append((child, key.start_mark.line + 1))
                self.keys[child] = key.start_mark.line + 1
                self._walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, i))

    def key(self, path: tuple[str | int, ...]) -> int | None:
        """Line of the key that introduces `path` (or of its value, or its nearest parent)."""
        return self.keys.get(path) or self.value(path)

    def value(self, path: tuple[str | int, ...]) -> int | None:
        """Line of the value at `path`, or of the nearest enclosing value that has one."""
        while path:
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get(())


def _jsonable(value: Any) -> Any:
    """YAML data as JSON data: keys become strings (YAML allows `0:` as an int key)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _describe(value: Any) -> str:
    """A value as the user wrote it, shortened; big mappings and lists by their kind."""
    text = repr(value)
    if len(text) <= 60:
        return text
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) \
        else text[:57] + "..."


_TYPE_WORDS = {
    "object": "a mapping of keys", "array": "a list", "string": "a string",
    "boolean": "true or false", "integer": "an integer", "number": "a number",
    "null": "null",
}


def _expected(schema: Any) -> str | None:
    if isinstance(schema, dict):
        expected = schema.get("x-expected")
        if isinstance(expected, str):
            return expected
        if "type" in schema and isinstance(schema["type"], str):
            return _TYPE_WORDS.get(schema["type"])
    return None


def _schema_problems(document: Any, lines: _Lines) -> Iterator[tuple[int | None, str, str]]:
    """(line, key path, reason) for every schema violation in `document`."""
    for error in _validator().iter_errors(document):
        yield from _problem(error, lines)


def _problem(error: jsonschema.ValidationError,
             lines: _Lines) -> Iterator[tuple[int | None, str, str]]:
    """Turn one jsonschema error into (line, key path, reason) lines a user can act on."""
    import jsonschema

    path = tuple(error.absolute_path)
    if error.validator in ("anyOf", "oneOf") and error.context:
        # A value of the right type that fails a finer check (an empty list where a
        # list or null is accepted) is better told by that check than by the anyOf.
        finer = [e for e in error.context if e.validator != "type"]
        if finer:
            yield from _problem(jsonschema.exceptions.best_match(finer), lines)
            return
    where = lines.value(path), _dotted(path)
    schema: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(schema.get("properties", {}))
        for name in sorted(set(error.instance) - set(known)):
            child = (*path, name)
            hint = f" (expected one of: {', '.join(known)})" if known else ""
            yield lines.key(child), _dotted(child), f"unknown key{hint}"
    elif "propertyNames" in error.schema_path:
        child = (*path, str(error.instance))
        expected = schema.get("x-expected", "")
        yield lines.key(child), _dotted(child), f"unknown key: expected {expected}"
    elif error.validator == "uniqueItems":
        yield *where, f"{_describe(error.instance)} has duplicate items"
    elif error.validator == "minItems":
        yield *where, "the list must not be empty"
    elif error.validator == "enum" or (expected := _expected(schema)) is None:
        yield *where, error.message
    else:
        yield *where, f"{_describe(error.instance)} is not {expected}"


def _memory(value: int | str) -> int:
    """Bytes of a memory value: an int is MiB (like a quantity without suffix); 0 is allowed."""
    if isinstance(value, int):
        return value << 20
    if value == "0":
        return 0
    return parse_memory(value)


def _build(path: Path | None, document: dict[str, Any], tree: yaml.Node | None,
           overrides: Mapping[str, object], accepted: Accepted | None = None) -> Config:
    lines = _Lines(tree)
    if lines.duplicates:
        dup_path, dup_line = lines.duplicates[0]
        raise ConfigError(path, "duplicate key (each key may appear once)",
                          key=_dotted(dup_path), line=dup_line)
    document = _jsonable(document)
    # An empty document is valid by construction: defaults work even where the
    # schema file was not installed.
    digest = None
    if accepted is not None and document:
        with contextlib.suppress(OSError):  # an unreadable schema: the check says so
            digest = document_digest(document)
    known = accepted is not None and digest is not None and digest in accepted
    problems = sorted(_schema_problems(document, lines) if document and not known else (),
                      key=lambda p: (p[0] if p[0] is not None else 0, p[1]))
    if problems:
        first_line, key, reason = problems[0]
        more = len(problems) - 1
        if more:
            reason += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise ConfigError(path, reason, key=key, line=first_line)
    if accepted is not None and digest is not None:
        accepted.add(digest)

    def get(section: str, key: str) -> Any:
        return document.get(section, {}).get(key, _MISSING)

    values: dict[str, Any] = {}
    for (section, key), name in _FIELDS.items():
        value = get(section, key)
        if value is not _MISSING:
            values[name] = value
    for name in ("state_dir", "run_dir", "socket", "event_log", "nvml_library", "cgroup_root",
                 "lib_dir"):
        if values.get(name) is not None:
            values[name] = Path(values[name])
        else:
            values.pop(name, None)
    for name, key_path in (("context_reserve", ("defaults", "context_reserve")),
                           ("guard_memory_margin", ("guard", "memory_margin")),
                           ("event_log_max_bytes", ("events", "max_size"))):
        if name not in values:
            continue
        raw = values[name]
        try:
            values[name] = _memory(raw)
        except QuantityError as e:
            raise ConfigError(path, f"{raw!r} is not 0 or a memory quantity: {MEMORY_FORMS}",
                              key=_dotted(key_path), line=lines.value(key_path)) from e
    if values.get("event_log_max_bytes", _MIN_EVENT_LOG) < _MIN_EVENT_LOG:
        key_path = ("events", "max_size")
        raise ConfigError(path, f"{get(*key_path)!r} is below the smallest event log, 4Ki",
                          key=_dotted(key_path), line=lines.value(key_path))
    address = values.get("metrics_address", "")
    if address and int(address.rsplit(":", 1)[1]) > 65535:
        key_path = ("metrics", "address")
        raise ConfigError(path, f"{address!r} has a port above 65535",
                          key=_dotted(key_path), line=lines.value(key_path))
    for name in ("reconcile_interval_s", "hook_wait_s", "guard_interval_s", "broker_orphan_s",
                 "guard_memory_escalate_window_s"):
        if name in values:
            values[name] = float(values[name])
    if values.get("devices_include") is not None:
        values["devices_include"] = tuple(
            int(d) if isinstance(d, str) and d.isdigit() else d
            for d in values["devices_include"])
    for name in ("runtime_state_roots", "cdi_spec_dirs"):
        if name in values:
            values[name] = tuple(Path(p) for p in values[name])
    trusted = document.get("requests", {}).get("trusted_sources", {})
    for name, key in (("trusted_pod_annotations", "pod_annotations"),
                      ("trusted_pod_env", "pod_env")):
        if key in trusted:
            values[name] = {ns: tuple(keys) for ns, keys in trusted[key].items()}
    if "device_nodes" in values:
        values["device_nodes"] = {
            (-1 if k == "*" else int(k)): tuple(v) for k, v in values["device_nodes"].items()}

    names = {f.name for f in dataclasses.fields(Config)} - {"source"}
    for name, value in overrides.items():
        if name not in names:
            raise ConfigError(path, f"unknown setting {name!r} given on the command line")
        if value is None:
            continue
        # Flags may be relative (`--state-dir ./st`): pin them to the start directory.
        values[name] = Path(str(value)).absolute() if name in _PATH_FIELDS else value
    # Paths that default relative to others follow them (--run-dir moves the socket).
    run_dir = Path(values.get("run_dir", Config.run_dir))
    state_dir = Path(values.get("state_dir", Config.state_dir))
    values.setdefault("socket", run_dir / SOCKET_NAME)
    values.setdefault("event_log", state_dir / "events.jsonl")
    values.setdefault("lib_dir", state_dir / "lib")
    return Config(**values, source=Path(path) if path is not None else None)


_MISSING = object()
#: The smallest events.max_size: a few events a file.
_MIN_EVENT_LOG = 4 << 10

#: (section, key) in the file -> Config field.
_FIELDS: dict[tuple[str, str], str] = {
    ("paths", "socket"): "socket",
    ("paths", "state_dir"): "state_dir",
    ("paths", "run_dir"): "run_dir",
    ("paths", "event_log"): "event_log",
    ("paths", "lib_dir"): "lib_dir",
    ("events", "max_size"): "event_log_max_bytes",
    ("events", "generations"): "event_log_generations",
    ("placement", "policy"): "placement_policy",
    ("placement", "allow_preemption"): "allow_preemption",
    ("defaults", "compute"): "default_compute",
    ("defaults", "priority"): "default_priority",
    ("defaults", "policy"): "default_policy",
    ("defaults", "priority_floor"): "priority_floor",
    ("defaults", "context_reserve"): "context_reserve",
    ("reconcile", "interval_s"): "reconcile_interval_s",
    ("reconcile", "drift_action"): "drift_action",
    ("reconcile", "runtime_state_roots"): "runtime_state_roots",
    ("guard", "action"): "guard_action",
    ("guard", "margin_percent"): "guard_margin",
    ("guard", "interval_s"): "guard_interval_s",
    ("guard", "memory_action"): "guard_memory_action",
    ("guard", "memory_margin"): "guard_memory_margin",
    ("guard", "memory_escalate_after"): "guard_memory_escalate_after",
    ("guard", "memory_escalate_window_s"): "guard_memory_escalate_window_s",
    ("guard", "memory_escalate_action"): "guard_memory_escalate_action",
    ("guard", "cgroup_root"): "cgroup_root",
    ("metrics", "address"): "metrics_address",
    ("devices", "include"): "devices_include",
    ("devices", "nodes"): "device_nodes",
    ("hook", "wait_s"): "hook_wait_s",
    ("broker", "orphan_s"): "broker_orphan_s",
    ("hook", "allow_env_requests"): "allow_env_requests",
    ("nvml", "library"): "nvml_library",
    ("runtime", "lower"): "runtime_lower",
    ("runtime", "cdi_spec_dirs"): "cdi_spec_dirs",
}
