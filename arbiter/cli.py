# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` command: list, inspect, change and release slices, and run a process in one.

Talks to vgpud over its unix socket (arbiter/proto/vgpu.proto). Pure parts
(argument parsing, quantity/priority parsing, table rendering, JSON shapes) are
separate from the gRPC calls and from `vgpu run`'s process handling so they can
be tested without a daemon. Every failure ends as one `vgpu: ...` line on
stderr: exit 1 for a runtime failure, 2 for bad arguments (argparse).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket as socketlib
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from arbiter.errors import VgpuError
from arbiter.quantity import format_memory, parse_compute, parse_memory

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_SOCKET",
    "CliError",
    "build_parser",
    "device_to_dict",
    "format_bytes",
    "main",
    "render_devices",
    "render_slices",
    "render_smi",
    "render_table",
    "short_owner",
    "slice_to_dict",
]

DEFAULT_SOCKET = "/run/vgpu/vgpud.sock"
DEFAULT_CONFIG = "/etc/vgpu/config.yaml"
DEFAULT_TIMEOUT_S = 10.0
# Signals `vgpu run` passes on to its child (SIGCHLD only wakes the wait loop).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Dispositions Python changes at start-up that a child must not inherit.
_RESET_IN_CHILD = (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)
_SI_KERNEL = 0x80  # si_code of a signal the kernel generated (a terminal's ^C, ^\)

_PRIORITIES = ("low", "normal", "high")
_POLICIES = ("fixed", "burst")
_KiB, _MiB, _GiB, _TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


class CliError(VgpuError):
    """A failure the CLI reports as one line and exit status 1.

    `status` is the gRPC status code's name when the failure came from a call.
    """

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


# ---- pure helpers -----------------------------------------------------------

def format_bytes(nbytes: int) -> str:
    """Return a short size for a table: exact (``1536Mi``) when short, else ``11.8Mi``."""
    if nbytes <= 0:
        return "0"
    try:
        exact = format_memory(nbytes)
    except VgpuError:
        exact = ""
    if exact and len(exact.rstrip("KMGTi")) <= 4:
        return exact
    for unit, size in (("Ti", _TiB), ("Gi", _GiB), ("Mi", _MiB), ("Ki", _KiB)):
        if nbytes >= size:
            return f"{nbytes / size:.1f}{unit}"
    return f"{nbytes}B"


def short_owner(owner: str) -> str:
    """Shorten a container id the way `docker ps` does (12 hex digits); keep other owners."""
    bare = owner.removeprefix("sha256:")
    if len(bare) > 12 and all(c in "0123456789abcdef" for c in bare):
        return bare[:12]
    return owner


def _enum_word(value: int, words: Sequence[str]) -> str:
    """Proto enum value (0 = unspecified, then words in order) -> lowercase word."""
    return words[value - 1] if 1 <= value <= len(words) else "default"


def priority_word(value: int) -> str:
    """Proto Priority -> ``low``/``normal``/``high``."""
    return _enum_word(value, _PRIORITIES)


def policy_word(value: int) -> str:
    """Proto Policy -> ``fixed``/``burst``."""
    return _enum_word(value, _POLICIES)


def _choice_type(kind: str, words: Sequence[str]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        word = text.strip().lower()
        if word not in words:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {text!r}: expected one of {', '.join(words)}")
        return words.index(word) + 1  # proto enums: 0 is "unspecified"
    parse.__name__ = kind
    return parse


parse_priority = _choice_type("priority", _PRIORITIES)
parse_policy = _choice_type("policy", _POLICIES)


def _arg_type(parse: Callable[[str], int], name: str) -> Callable[[str], int]:
    """Wrap a quantity parser so argparse prints its message and exits 2."""
    def wrapped(text: str) -> int:
        try:
            return parse(text)
        except VgpuError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    wrapped.__name__ = name
    return wrapped


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected an integer >= 1")
    return n


def _devices(text: str) -> list[str]:
    items = [d.strip() for d in text.split(",")]
    if not text.strip() or any(not d for d in items):
        raise argparse.ArgumentTypeError(
            f"invalid devices {text!r}: expected GPU indices or UUIDs, comma separated")
    return items


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid timeout {text!r}: expected seconds > 0")
    return value


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 right: Sequence[int] = ()) -> str:
    """Render rows as aligned columns under headers (docker-style), right-aligning `right`."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i])
               for i, c in enumerate(cells)]
        return "   ".join(out).rstrip()
    return "\n".join([line(headers), *(line(r) for r in rows)])


# ---- JSON shapes (plain ints and words, not protobuf's JSON mapping) ---------

def vgpu_to_dict(v: Any) -> dict[str, Any]:
    """One vGPU of a slice as a JSON object."""
    return {
        "index": v.index,
        "gpu_index": v.gpu_index,
        "gpu_uuid": v.gpu_uuid,
        "memory_bytes": v.memory_bytes,
        "memory_used_bytes": v.memory_used_bytes,
        "compute_percent": v.compute_percent,
        "region_path": v.region_path,
        "device_nodes": list(v.device_nodes),
    }


def slice_to_dict(s: Any) -> dict[str, Any]:
    """A Slice message as a JSON object (full owner, enum words, byte counts as ints)."""
    return {
        "id": s.id,
        "owner": s.owner,
        "owner_kind": s.owner_kind,
        "owner_pid": s.owner_pid,
        "priority": priority_word(s.priority),
        "policy": policy_word(s.policy),
        "region_dir": s.region_dir,
        "created_unix_ms": s.created_unix_ms,
        "labels": dict(sorted(s.labels.items())),
        "vgpus": [vgpu_to_dict(v) for v in s.vgpus],
    }


def device_to_dict(d: Any) -> dict[str, Any]:
    """A Device message as a JSON object."""
    return {
        "index": d.index,
        "uuid": d.uuid,
        "name": d.name,
        "minor": d.minor,
        "memory_total_bytes": d.memory_total_bytes,
        "memory_allocated_bytes": d.memory_allocated_bytes,
        "memory_used_bytes": d.memory_used_bytes,
        "compute_allocated_percent": d.compute_allocated_percent,
        "utilization_percent": d.utilization_percent,
        "slices": d.slices,
        "device_nodes": list(d.device_nodes),
    }


def dump_json(value: object) -> str:
    """The CLI's JSON output: indented, stable key order as built."""
    return json.dumps(value, indent=2)


# ---- tables -----------------------------------------------------------------

def render_devices(devices: Sequence[Any]) -> str:
    """`vgpu devices`: one row per GPU."""
    rows = [[str(d.index), d.uuid, d.name, format_bytes(d.memory_total_bytes),
             format_bytes(d.memory_allocated_bytes), format_bytes(d.memory_used_bytes),
             f"{d.compute_allocated_percent}%", str(d.slices)] for d in devices]
    return render_table(["GPU", "UUID", "NAME", "MEMORY", "ALLOCATED", "USED", "COMPUTE",
                         "SLICES"], rows, right=(0, 3, 4, 5, 6, 7))


def render_slices(slices: Sequence[Any]) -> str:
    """`vgpu ls`: one row per vGPU; a multi-GPU slice's later rows leave the slice columns blank."""
    rows: list[list[str]] = []
    for s in slices:
        head = [s.id, short_owner(s.owner), priority_word(s.priority), policy_word(s.policy)]
        vgpus = list(s.vgpus) or [None]
        for i, v in enumerate(vgpus):
            cells = head if i == 0 else [""] * len(head)
            if v is None:
                rows.append([*cells, "-", "-", "-", "-"])
                continue
            rows.append([*cells, str(v.index), str(v.gpu_index),
                         f"{format_bytes(v.memory_used_bytes)} / {format_bytes(v.memory_bytes)}",
                         f"{v.compute_percent}%"])
    return render_table(["SLICE", "OWNER", "PRIORITY", "POLICY", "VGPU", "GPU", "MEMORY",
                         "COMPUTE"], rows, right=(4, 5, 7))


def _bar(used: int, limit: int, width: int = 10) -> str:
    if limit <= 0:
        return "[" + " " * width + "]"
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _pct(used: int, limit: int) -> str:
    return f"{100 * used / limit:.0f}%" if limit > 0 else "-"


def render_smi(devices: Sequence[Any], slices: Sequence[Any], version: str = "",
               width: int = 96) -> str:
    """`vgpu smi`: an nvidia-smi-like box per GPU with its slices under it (<= width columns)."""
    border = "+" + "-" * (width - 2) + "+"
    double = "+" + "=" * (width - 2) + "+"

    def boxed(text: str) -> str:
        inner = width - 4
        if len(text) > inner:
            text = text[: inner - 3] + "..."
        return "| " + text.ljust(inner) + " |"

    now = time.strftime("%a %b %d %H:%M:%S %Y")
    out = [now, border]
    title = f"vgpu smi    vgpud {version or '?'}"
    summary = f"{len(devices)} GPU{'s' * (len(devices) != 1)}   " \
              f"{len(slices)} slice{'s' * (len(slices) != 1)}"
    out.append(boxed(title + summary.rjust(width - 4 - len(title))))
    by_gpu: dict[int, list[tuple[Any, Any]]] = {}
    for s in slices:
        for v in s.vgpus:
            by_gpu.setdefault(v.gpu_index, []).append((s, v))
    # Slice rows: id, owner, priority/policy, memory used/limit with a bar, compute share.
    cols = (("Slice", 14), ("Owner", 14), ("Prio/Policy", 13), ("Memory used / limit", 31),
            ("Compute", 8))
    for d in devices:
        out.append(double)  # closes the block above
        out.append(boxed(f"GPU {d.index}  {d.name}".ljust(40) + d.uuid))
        mem = (f"Memory {format_bytes(d.memory_used_bytes)} used / "
               f"{format_bytes(d.memory_allocated_bytes)} allocated / "
               f"{format_bytes(d.memory_total_bytes)}")
        comp = (f"Compute {d.utilization_percent}% used / "
                f"{d.compute_allocated_percent}% allocated")
        out.append(boxed(mem + "    " + comp))
        out.append(boxed(f"{_bar(d.memory_allocated_bytes, d.memory_total_bytes, 30)} "
                         f"memory allocated {_pct(d.memory_allocated_bytes, d.memory_total_bytes)}"
                         f"   slices {d.slices}"))
        out.append(border)
        members = by_gpu.get(d.index, [])
        if not members:
            out.append(boxed("no slices"))
        else:
            out.append(boxed(" ".join(name.ljust(w) for name, w in cols).rstrip()))
            for s, v in members:
                memory = (f"{format_bytes(v.memory_used_bytes):>7} / "
                          f"{format_bytes(v.memory_bytes):<7} "
                          f"{_bar(v.memory_used_bytes, v.memory_bytes)}")
                owner = short_owner(s.owner)
                if len(owner) > 14:
                    owner = owner[:13] + "~"
                cells = (s.id[:14], owner,
                         f"{priority_word(s.priority)}/{policy_word(s.policy)}", memory,
                         f"{v.compute_percent}%")
                out.append(boxed(" ".join(c.ljust(w) for c, (_, w) in zip(cells, cols,
                                                                          strict=True)).rstrip()))
    if not devices:
        out.append(border)
        out.append(boxed("no GPUs"))
    out.append(border)
    return "\n".join(out)


# ---- arguments ----------------------------------------------------------------

def _version() -> str:
    try:
        return metadata.version("vgpu")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The `vgpu` argument parser (global options are accepted before or after the command)."""
    # Options every command takes. The copies on the subcommands default to SUPPRESS so
    # `vgpu --socket X ls` is not overwritten by the subcommand's default.
    def common(suppress: bool) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(add_help=False)
        d: Callable[[object], object] = (lambda _v: argparse.SUPPRESS) if suppress \
            else (lambda v: v)
        p.add_argument("--socket", metavar="PATH", default=d(None),
                       help=f"vgpud's socket (default: $VGPU_SOCKET, else {DEFAULT_SOCKET})")
        p.add_argument("--config", metavar="FILE", default=d(None),
                       help=f"config file (default: $VGPU_CONFIG, else {DEFAULT_CONFIG}); "
                            "`vgpu info` reports it")
        p.add_argument("--timeout", metavar="SECONDS", type=_timeout,
                       default=d(DEFAULT_TIMEOUT_S),
                       help=f"deadline of each call to vgpud (default {DEFAULT_TIMEOUT_S:g})")
        return p

    parser = argparse.ArgumentParser(
        prog="vgpu", parents=[common(False)],
        description="Inspect and manage GPU slices held by vgpud.")
    parser.add_argument("--version", action="version", version=f"vgpu {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    shared = common(True)

    def add(name: str, help_: str, listing: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[shared], help=help_, description=help_)
        p.set_defaults(subparser=p)  # for usage errors found after parsing
        if listing:
            p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    add("devices", "list the GPUs and what is allocated on them", listing=True)
    add("ls", "list the slices", listing=True)
    add("smi", "an nvidia-smi-like view of every GPU and its slices", listing=True)
    add("info", "print every path in use and the versions", listing=True)

    p = add("release", "release a slice, by id or by owner")
    p.add_argument("target", metavar="ID|OWNER", help="slice id or owner (container id)")

    p = add("update", "change a running slice's memory limit or compute share in place",
            listing=True)
    p.add_argument("id", help="slice id")
    p.add_argument("--memory", metavar="Q", type=_arg_type(parse_memory, "memory"),
                   help="new memory per vGPU (no suffix = MiB; Ki Mi Gi Ti, K M G T)")
    p.add_argument("--compute", metavar="P", type=_arg_type(parse_compute, "compute"),
                   help="new compute share per vGPU, percent 2..100")

    p = add("run", "run a command in a fresh slice; the slice is released when it exits")
    p.add_argument("--memory", metavar="Q", type=_arg_type(parse_memory, "memory"),
                   required=True, help="memory per vGPU (no suffix = MiB)")
    p.add_argument("--compute", metavar="P", type=_arg_type(parse_compute, "compute"),
                   default=0, help="compute share per vGPU, percent (default: vgpud's config)")
    p.add_argument("--count", metavar="N", type=_count, default=1,
                   help="number of vGPUs, each on a distinct GPU (default 1)")
    p.add_argument("--priority", metavar="C", type=parse_priority, default=0,
                   help="low, normal or high (default: vgpud's config)")
    p.add_argument("--policy", metavar="P", type=parse_policy, default=0,
                   help="fixed or burst (default: vgpud's config)")
    p.add_argument("--devices", metavar="LIST", type=_devices, default=[],
                   help="pin to these GPUs: indices or UUIDs, comma separated")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say on stderr which slice the command runs in")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="the command and its arguments")

    from shim import install

    p = add("install", "register vgpu with docker, containerd or podman (edits their config)")
    install.add_arguments(p)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse argv; exits 2 with usage on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            args.subparser.error("a command to run is required after --")
        args.cmd = cmd
    if args.command == "update" and args.memory is None and args.compute is None:
        args.subparser.error("nothing to change: give --memory and/or --compute")
    return args


def resolve_socket(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """--socket, else $VGPU_SOCKET, else the config file's socket, else the default path."""
    if args.socket:
        return str(args.socket)
    if env.get("VGPU_SOCKET"):
        return env["VGPU_SOCKET"]
    config = resolve_config(args, env)
    if Path(config).is_file():  # only then: loading the schema costs time
        paths = _config_paths(config)
        if "config_error" in paths:
            raise CliError(paths["config_error"])
        if paths.get("config_socket"):
            return str(paths["config_socket"])
    return DEFAULT_SOCKET


def resolve_config(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """--config, else $VGPU_CONFIG, else the default path."""
    return str(args.config or env.get("VGPU_CONFIG") or DEFAULT_CONFIG)


# ---- talking to vgpud -----------------------------------------------------------

@dataclass
class Client:
    """A connection to vgpud: the stub, the socket path (for messages) and the deadline."""

    socket: str
    timeout: float
    stub: Any
    channel: Any

    def call(self, method: str, request: object) -> Any:
        """Call one RPC; turn every gRPC failure into one CliError line."""
        import grpc

        try:
            return getattr(self.stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error(e, self.socket, self.timeout) from e

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def unreachable(socket: str, cause: str) -> CliError:
    """The one line for "vgpud is not there"."""
    return CliError(f"cannot reach vgpud at {socket}: {cause} "
                    "(is vgpud running? start it with 'vgpud' or pass --socket)")


def check_socket(path: str) -> None:
    """Fail early, with a precise cause, when the socket path cannot be vgpud's."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise unreachable(path, "no such socket") from None
    except PermissionError:
        raise unreachable(path, "permission denied") from None
    except NotADirectoryError:
        raise unreachable(path, "no such socket") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise unreachable(path, "not a socket")
    if not os.access(path, os.R_OK | os.W_OK):
        raise CliError(f"cannot reach vgpud at {path}: permission denied "
                       "(the socket is for root; run vgpu as root)")


def rpc_error(e: Any, socket: str, timeout: float) -> CliError:
    """Map a grpc.RpcError to the CLI's one line."""
    import grpc

    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or str(code)
    details = " ".join(str(details).split())  # one line, whatever the server sent
    name = code.name if code is not None else None
    if code == grpc.StatusCode.UNAVAILABLE:
        cause = "connection refused" if "refused" in details.lower() else details
        e2 = unreachable(socket, cause)
        e2.status = name
        return e2
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(f"vgpud at {socket} did not answer within {timeout:g}s", name)
    return CliError(details, name)


@contextmanager
def connect(socket: str, timeout: float) -> Iterator[Client]:
    """Open a channel to vgpud's unix socket (after checking the path is a socket)."""
    check_socket(socket)
    import grpc

    from arbiter.proto import vgpu_pb2_grpc

    channel = grpc.insecure_channel(f"unix:{socket}")
    stub = vgpu_pb2_grpc.ArbiterStub(channel)
    client = Client(socket, timeout, stub, channel)
    try:
        yield client
    finally:
        client.close()


def _pb() -> Any:
    from arbiter.proto import vgpu_pb2

    return vgpu_pb2


# ---- commands -------------------------------------------------------------------

Out = Callable[[str], None]


def cmd_devices(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu devices`."""
    devices = c.call("Devices", _pb().DevicesRequest()).devices
    out(dump_json([device_to_dict(d) for d in devices]) if args.json
        else render_devices(devices))
    return 0


def cmd_ls(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu ls`."""
    slices = c.call("List", _pb().ListRequest()).slices
    out(dump_json([slice_to_dict(s) for s in slices]) if args.json else render_slices(slices))
    return 0


def cmd_smi(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu smi`."""
    pb = _pb()
    devices = c.call("Devices", pb.DevicesRequest()).devices
    slices = c.call("List", pb.ListRequest()).slices
    if args.json:
        out(dump_json({"devices": [device_to_dict(d) for d in devices],
                       "slices": [slice_to_dict(s) for s in slices]}))
        return 0
    version = c.call("Health", pb.HealthRequest()).version
    out(render_smi(devices, slices, version))
    return 0


def cmd_release(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu release ID|OWNER`: by id first, then by owner."""
    import grpc

    pb = _pb()
    for field in ("id", "owner"):
        try:
            r = c.stub.Release(pb.ReleaseRequest(**{field: args.target}), timeout=c.timeout)
        except grpc.RpcError as e:
            # A daemon may answer NOT_FOUND / INVALID_ARGUMENT for "no such id": try the owner.
            if field == "id" and e.code() in (grpc.StatusCode.NOT_FOUND,
                                              grpc.StatusCode.INVALID_ARGUMENT):
                continue
            raise rpc_error(e, c.socket, c.timeout) from e
        if r.released:
            out(f"released slice {r.id or args.target}")
            return 0
    raise CliError(f"failed to release slice {args.target}: no slice has this id or owner")


def cmd_update(args: argparse.Namespace, c: Client, out: Out) -> int:
    """`vgpu update ID --memory Q --compute P`."""
    s = c.call("Update", _pb().UpdateRequest(id=args.id, memory_bytes=args.memory or 0,
                                             compute_percent=args.compute or 0))
    out(dump_json(slice_to_dict(s)) if args.json else render_slices([s]))
    return 0


def cmd_info(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    """`vgpu info`: every path in use, local and (when reachable) as vgpud reports it."""
    from arbiter.native import libvgpu_path

    try:
        sock = resolve_socket(args, env)
    except CliError:  # a broken config file: reported below, from _config_paths
        sock = DEFAULT_SOCKET
    config = resolve_config(args, env)
    info: dict[str, Any] = {"version": _version(), "socket": sock, "config": config,
                            "config_exists": Path(config).is_file()}
    try:
        info["libvgpu"] = str(libvgpu_path())
    except VgpuError as e:
        info["libvgpu"] = None
        info["libvgpu_error"] = str(e)
    from arbiter.lifecycle import lifecycle_socket
    from arbiter.native import program_path

    # The compiled fast path (None: not built; the Python programs do the work).
    for name in ("vgpu-runtime", "vgpu-hook", "vgpu-broker"):
        found = program_path(name)
        info[name.replace("-", "_")] = str(found) if found else None
    info["lifecycle_socket"] = str(lifecycle_socket(sock))
    local = _config_paths(config)
    info.update(local)
    daemon: dict[str, Any] = {}
    try:
        with connect(sock, args.timeout) as c:
            pb = _pb()
            h = c.call("Health", pb.HealthRequest())
            daemon = {"reachable": True, "status": h.status, "version": h.version,
                      "devices": h.devices, "slices": h.slices,
                      "uptime_seconds": round(h.uptime_seconds, 1),
                      "paths": dict(h.paths)}
    except CliError as e:
        cause = str(e).removeprefix(f"cannot reach vgpud at {sock}: ")
        daemon = {"reachable": False, "error": cause}
    info["vgpud"] = daemon
    if args.json:
        out(dump_json(info))
        return 0
    rows = [("version", f"vgpu {info['version']}"),
            ("socket", sock),
            ("config", config + ("" if info["config_exists"] else " (absent: defaults)")),
            *([("config socket", str(local["config_socket"]))]
              if local.get("config_socket") not in (None, sock) else []),
            ("libvgpu.so", info["libvgpu"] or f"not found: {info['libvgpu_error']}"),
            ("vgpu-runtime", info["vgpu_runtime"] or "not built (the Python one runs)"),
            ("vgpu-hook", info["vgpu_hook"] or "not built (the Python one runs)"),
            ("vgpu-broker", info["vgpu_broker"] or "not built (vgpud cannot start)"),
            ("lifecycle socket", info["lifecycle_socket"])]
    for key in ("state_dir", "run_dir", "event_log", "metrics_address", "config_error"):
        if key in local:
            rows.append((key.replace("_", " "), str(local[key]) or "(disabled)"))
    if daemon.get("reachable"):
        rows.append(("vgpud", f"{daemon['status']}, version {daemon['version']}, "
                              f"{daemon['devices']} GPUs, {daemon['slices']} slices, "
                              f"up {daemon['uptime_seconds']:g}s"))
        for key, value in sorted(daemon["paths"].items()):
            rows.append((f"vgpud {key.replace('_', ' ')}", value or "(none)"))
    else:
        rows.append(("vgpud", f"not reachable: {daemon['error']}"))
    width = max(len(k) for k, _ in rows)
    out("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0


def _config_paths(config: str) -> dict[str, Any]:
    """Paths the config file (or the defaults) names; empty when arbiter.config is absent."""
    try:
        from arbiter import config as config_mod
    except ImportError:
        return {}
    try:
        cfg = config_mod.load_config(Path(config))
    except VgpuError as e:
        return {"config_error": str(e)}
    except OSError as e:
        return {"config_error": f"failed to load config {config}: {e.strerror or e}"}
    result: dict[str, Any] = {}
    for key in ("socket", "state_dir", "run_dir", "event_log", "metrics_address"):
        if hasattr(cfg, key):
            value = getattr(cfg, key)
            result["config_socket" if key == "socket" else key] = (
                str(value) if value is not None else None)
    return result


# ---- vgpu run ---------------------------------------------------------------------

def run_owner(pid: int | None = None, host: str | None = None) -> str:
    """The owner name of a `vgpu run` slice: run-<hostname>-<pid>-<random>."""
    return (f"run-{host or socketlib.gethostname()}-{pid if pid is not None else os.getpid()}"
            f"-{secrets.token_hex(4)}")


def child_env(env: Mapping[str, str], library: str, region_dir: str,
              gpu_uuids: Sequence[str] = (), sched_dir: str = "") -> dict[str, str]:
    """The child's environment: libvgpu preloaded first, the slice's region dir named.

    CUDA_VISIBLE_DEVICES lists the slice's GPUs in vGPU order, by UUID (CUDA's own
    enumeration order may differ from NVML's): libvgpu checks that CUDA device i is
    the GPU of region file vgpu<i>. VGPU_SCHED_DIR names vgpud's per-GPU scheduling
    regions, so that the child shares each GPU's compute with the containers on it
    (without it, the child would schedule alone and ignore their shares).
    """
    result = dict(env)
    preload = result.get("LD_PRELOAD", "").strip()
    result["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    result["VGPU_REGION_DIR"] = region_dir
    if sched_dir:
        result["VGPU_SCHED_DIR"] = sched_dir
    if gpu_uuids and all(gpu_uuids):
        result["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
    return result


def exit_status(wait_status: int) -> int:
    """A child's wait status as a shell exit code (128+signal when killed)."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def _pending_forwarded() -> int:
    pending = signal.sigpending()
    for sig in FORWARDED:
        if sig in pending:
            return int(sig)
    return 0


def supervise(pid: int) -> int:
    """Wait for the child, forwarding SIGINT/SIGTERM/SIGHUP; return its wait status.

    The signals are blocked in every thread and taken with sigtimedwait, so none is
    lost to a gRPC thread. A signal the kernel generated (a terminal's ^C) already
    reached the child, which shares our process group: it is not sent twice.
    """
    waitset = {*FORWARDED, signal.SIGCHLD}
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        info = signal.sigtimedwait(waitset, 0.5)
        # Only a forwarded signal is sent on: a wait the cgroup freezer interrupted
        # (vgpud's compute guard throttling this slice) can return an empty siginfo.
        if info is None or info.si_signo not in FORWARDED:
            continue
        if info.si_code == _SI_KERNEL:
            continue
        with suppress(ProcessLookupError):
            os.kill(pid, info.si_signo)


def cmd_run(args: argparse.Namespace, env: Mapping[str, str], err: Out) -> int:
    """`vgpu run`: allocate a slice, run CMD in it, release it however CMD ends."""
    from arbiter.native import libvgpu_path

    library = str(libvgpu_path())
    sock = resolve_socket(args, env)
    check_socket(sock)
    # Block before the gRPC channel exists: its threads inherit the mask, so the
    # signals stay pending for supervise() (and during Allocate) instead of being lost.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
    owner = run_owner()
    pb = _pb()
    try:
        with connect(sock, args.timeout) as c:
            # Whether a slice may exist that the finally must release: not after a
            # definite refusal (no capacity, bad request), so the user sees one line.
            granted: bool | None = None
            try:
                try:
                    r = c.call("Allocate", pb.AllocateRequest(
                        owner=owner, memory_bytes=args.memory, compute_percent=args.compute,
                        count=args.count, priority=args.priority, policy=args.policy,
                        devices=args.devices, owner_kind="process", owner_pid=os.getpid(),
                        labels={"vgpu.io/command": " ".join(args.cmd)[:200]}))
                except CliError as e:
                    # A deadline may have passed after vgpud granted it: release quietly.
                    granted = False if e.status != "DEADLINE_EXCEEDED" else None
                    raise
                granted = True
                s = r.slice
                # An older vgpud reports no sched_dir: the child then schedules alone.
                sched_dir = c.call("Health", pb.HealthRequest()).paths.get("sched_dir", "")
                if args.verbose:
                    err(f"vgpu: running in slice {s.id} "
                        f"({len(s.vgpus)} vGPU, {format_bytes(args.memory)} each)")
                sig = _pending_forwarded()
                if sig:
                    return 128 + sig
                try:
                    pid = os.posix_spawnp(
                        args.cmd[0], args.cmd, child_env(
                            env, library, s.region_dir,
                            [v.gpu_uuid for v in sorted(s.vgpus, key=lambda v: v.index)],
                            sched_dir),
                        setsigmask=(), setsigdef=_RESET_IN_CHILD)
                except OSError as e:
                    err(f"vgpu: failed to run {args.cmd[0]}: {e.strerror or e}")
                    return 127 if isinstance(e, FileNotFoundError) else 126
                return exit_status(supervise(pid))
            finally:
                # Signals that came after the child ended must not hit the CLI once
                # unblocked: the exit status is the child's.
                while signal.sigtimedwait({*FORWARDED, signal.SIGCHLD}, 0) is not None:
                    pass
                # By owner, so a slice granted while we were interrupted is freed too.
                if granted is not False:
                    _release_quietly(c, pb, owner, err if granted else lambda _t: None)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _release_quietly(c: Client, pb: Any, owner: str, err: Out) -> None:
    try:
        c.call("Release", pb.ReleaseRequest(owner=owner))
    except CliError as e:
        err(f"vgpu: failed to release the slice of {owner}: {e} "
            "(vgpud's reconciler frees it once this process is gone)")


# ---- entry point ---------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Run the `vgpu` command line; return the exit status."""
    args = parse_args(argv)
    env = os.environ

    def out(text: str) -> None:
        print(text, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    handlers: dict[str, Callable[[argparse.Namespace, Client, Out], int]] = {
        "devices": cmd_devices, "ls": cmd_ls, "smi": cmd_smi,
        "release": cmd_release, "update": cmd_update,
    }
    try:
        if args.command == "info":
            return cmd_info(args, env, out)
        if args.command == "run":
            return cmd_run(args, env, err)
        if args.command == "install":
            from shim import install

            return install.run(args, out)
        with connect(resolve_socket(args, env), args.timeout) as c:
            return handlers[args.command](args, c, out)
    except VgpuError as e:
        err(f"vgpu: {e}")
        return 1
    except BrokenPipeError:
        # `vgpu ls | head`: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
