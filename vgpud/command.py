# SPDX-License-Identifier: Apache-2.0
"""The `vgpud` command (the console script and `python -m vgpud`): vgpud.main as a process.

Most of a restart's start is importing (grpc, jsonschema, prometheus_client, the domain):
those imports allocate several hundred thousand objects, and the collections of the cyclic
garbage collector that they trigger find nothing to free, so they run with it off (~7% of
the imports here). The process ends as soon as vgpud has closed (daemon.exit_process).
"""
from __future__ import annotations

import gc
import sys
from typing import NoReturn

__all__ = ["run"]


def run() -> NoReturn:
    """Run vgpud with the command line's flags; exit with its status."""
    gc.disable()
    try:
        from arbiter.daemon.server import exit_process
        from vgpud.main import main
    finally:
        gc.enable()
    exit_process(main(sys.argv[1:]))
