# SPDX-License-Identifier: Apache-2.0
"""Pure parsing of an OCI runtime command line (runc's): which subcommand, which bundle, which id.

vgpu-runtime only needs to know whether a call is `create` / `run`, where the
bundle is and what the container id is; everything else passes through. The
parser mirrors runc's (urfave/cli on Go's flag package): global flags come before
the subcommand, a flag may start with one or two dashes and carry its value as
`--flag value` or `--flag=value`, and flag parsing of a subcommand stops at its
first positional argument (the container id) or at `--`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SPEC_COMMANDS", "Invocation", "parse_argv"]

#: Subcommands that create a container from a bundle: the only ones whose spec we touch.
SPEC_COMMANDS = frozenset({"create", "run"})

# runc's global flags that take a value (the rest are booleans: --debug, --systemd-cgroup).
# `--bundle X create ...` is accepted too (nvidia-container-runtime does): some callers
# put the bundle before the subcommand.
_GLOBAL_VALUED = frozenset({"root", "log", "log-format", "criu", "rootless", "bundle", "b"})
# Flags of `create` / `run` that take a value.
_SPEC_VALUED = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})
# Go's flag package accepts an explicit value for booleans too (`--detach=false`).


@dataclass(frozen=True)
class Invocation:
    """What a runtime command line asks for; `argv` is kept to pass on untouched."""

    argv: tuple[str, ...]
    command: str | None           # the subcommand (None: only global flags, e.g. --version)
    global_flags: tuple[tuple[str, str | None], ...] = ()
    bundle: Path | None = None    # create/run: the bundle directory (absolute)
    container_id: str | None = None

    @property
    def creates(self) -> bool:
        """True for `create` and `run` with a container id: the spec may be changed."""
        return self.command in SPEC_COMMANDS and bool(self.container_id)

    def global_flag(self, name: str) -> str | None:
        """The value of a global flag (`root`, `log`...), the last one given winning."""
        value = None
        for flag, v in self.global_flags:
            if flag == name:
                value = v
        return value


def _split_flag(token: str) -> tuple[str, str | None] | None:
    """`--name=value` -> (name, value); `-n` -> (n, None); not a flag -> None."""
    if len(token) < 2 or not token.startswith("-") or token in ("--",):
        return None
    name = token[2:] if token.startswith("--") else token[1:]
    if name.startswith("-") or not name:   # `---x` is no flag Go would accept
        return None
    if "=" in name:
        name, value = name.split("=", 1)
        return name, value
    return name, None


def parse_argv(argv: Sequence[str], cwd: Path | None = None) -> Invocation:
    """Parse a runtime command line (argv[0] is the program) into an Invocation.

    `cwd` resolves a relative or missing `--bundle` the way runc does (the current
    directory); it defaults to the process's own.
    """
    args = list(argv[1:])
    flags: list[tuple[str, str | None]] = []
    i = 0
    command: str | None = None
    while i < len(args):
        token = args[i]
        if token == "--":
            i += 1
            if i < len(args):
                command = args[i]
                i += 1
            break
        split = _split_flag(token)
        if split is None:
            command = token
            i += 1
            break
        name, value = split
        if value is None and name in _GLOBAL_VALUED and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        flags.append((name, value))
        i += 1
    if command not in SPEC_COMMANDS:
        return Invocation(tuple(argv), command, tuple(flags))

    bundle: str | None = None
    for name, value in flags:
        if name in ("bundle", "b"):
            bundle = value
    container_id: str | None = None
    while i < len(args):
        token = args[i]
        if token == "--":
            container_id = args[i + 1] if i + 1 < len(args) else None
            break
        split = _split_flag(token)
        if split is None:
            container_id = token
            break
        name, value = split
        if value is None and name in _SPEC_VALUED and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        if name in ("bundle", "b"):
            bundle = value
        i += 1
    base = cwd if cwd is not None else Path.cwd()
    path = base / bundle if bundle else base   # runc: an empty --bundle is the cwd
    return Invocation(tuple(argv), command, tuple(flags), Path(path), container_id)
