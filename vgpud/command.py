# SPDX-License-Identifier: Apache-2.0
"""The `vgpud` command (the console script and `python -m vgpud`): vgpud.main as a process.

Most of a restart's start is importing (grpc, jsonschema, prometheus_client, the domain):
those imports allocate several hundred thousand objects, and the collections of the cyclic
garbage collector that they trigger find nothing to free, so they run with it off (~7% of
the imports here). The process ends as soon as vgpud has closed (daemon.exit_process).

gRPC's core reads GRPC_POLL_STRATEGY once, as grpc is imported: vgpud asks for its poll()
engine unless the environment names one. vgpud's clients are a handful of local
connections, and with poll() under 8 clients each Allocate+Release cost vgpud ~4 % less CPU
and the pairs came ~6 % faster than with the default epoll1 (docs/performance.md).
"""
from __future__ import annotations

import gc
import os
import sys
from typing import NoReturn

__all__ = ["POLL_STRATEGY", "run"]

#: gRPC's polling engine for vgpud when the environment names none.
POLL_STRATEGY = "poll"


def run() -> NoReturn:
    """Run vgpud with the command line's flags; exit with its status."""
    os.environ.setdefault("GRPC_POLL_STRATEGY", POLL_STRATEGY)
    gc.disable()
    try:
        from arbiter.daemon.server import exit_process
        from vgpud.main import main
    finally:
        gc.enable()
    exit_process(main(sys.argv[1:]))
