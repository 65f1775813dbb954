# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` command line: the parser, its value types and the checks argparse cannot
express. Bad arguments exit 2 with usage and one line naming the option and value."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from arbiter.errors import VgpuError
from arbiter.quantity import parse_compute, parse_memory
from arbiter.version import version
from vgpu_cli.paths import DEFAULT_CONFIG, DEFAULT_SOCKET
from vgpu_cli.render import POLICIES, PRIORITIES

__all__ = ["DEFAULT_TIMEOUT_S", "build_parser", "parse_args", "parse_policy",
           "parse_priority"]

DEFAULT_TIMEOUT_S = 10.0


def _choice_type(kind: str, words: Sequence[str]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        word = text.strip().lower()
        if word not in words:
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {text!r}: expected one of {', '.join(words)}")
        return words.index(word) + 1  # proto enums: 0 is "unspecified"
    parse.__name__ = kind
    return parse


parse_priority = _choice_type("priority", PRIORITIES)
parse_policy = _choice_type("policy", POLICIES)


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
    parser.add_argument("--version", action="version", version=f"vgpu {version()}")
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

    from shim import uninstall

    p = add("uninstall", "take vgpu out of docker, containerd or podman (what install wrote)")
    uninstall.add_arguments(p)

    from vgpu_cli import upgrade

    p = add("upgrade", "switch this host to this package's version: install it beside the "
                       "old, switch engines, restart vgpud, roll back on failure")
    upgrade.add_arguments(p)
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
