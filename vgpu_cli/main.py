# SPDX-License-Identifier: Apache-2.0
"""`vgpu`'s entry point: parse, dispatch to a command, turn every failure into one line.

Exit status: the command's; 1 for a runtime failure (one `vgpu: ...` line on stderr);
2 for bad arguments (argparse); `vgpu run` passes on its child's.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from arbiter.errors import VgpuError
from vgpu_cli.args import parse_args
from vgpu_cli.client import connect
from vgpu_cli.commands import HANDLERS, cmd_info
from vgpu_cli.paths import resolve_socket
from vgpu_cli.run import cmd_run

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `vgpu` command line; return the exit status."""
    args = parse_args(argv)
    env = os.environ

    def out(text: str) -> None:
        print(text, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        if args.command == "info":
            return cmd_info(args, env, out)
        if args.command == "run":
            return cmd_run(args, env, err)
        if args.command == "install":
            from shim import install

            return install.run(args, out)
        if args.command == "uninstall":
            from shim import uninstall

            return uninstall.run(args, out)
        if args.command == "upgrade":
            from vgpu_cli.upgrade import cmd_upgrade

            return cmd_upgrade(args, env, out)
        with connect(resolve_socket(args, env), args.timeout) as c:
            return HANDLERS[args.command](args, c, out)
    except VgpuError as e:
        err(f"vgpu: {e}")
        return 1
    except BrokenPipeError:
        # `vgpu ls | head`: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
