# SPDX-License-Identifier: Apache-2.0
"""Prerequisites of the suites that guard contracts (the CUDA ABI, hostile mounts).

Where one is missing such a suite skips on a developer's machine, but fails in CI ($CI
set to anything but "", "0", "false" or "no"; .ci/run sets CI=true): a contract suite
that silently stopped running would look like one that passes.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

__all__ = ["cuda_headers_expected", "in_ci", "require"]


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the tests run in CI."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(ok: bool, reason: str, environ: Mapping[str, str] = os.environ) -> None:
    """Go on when `ok`; else skip (module level or inside a test or fixture), or in CI fail
    with `reason`."""
    if ok:
        return
    if in_ci(environ):
        pytest.fail(f"{reason} (CI={environ['CI']}: a contract suite must run here, not skip)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def cuda_headers_expected(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether libvgpu's ABI suite must find CUDA headers here: a toolkit is named
    (CUDA_HOME, CUDA_PATH), or CI that did not opt out (VGPU_NO_CUDA_TOOLKIT=1)."""
    if environ.get("CUDA_HOME") or environ.get("CUDA_PATH"):
        return True
    return in_ci(environ) and environ.get("VGPU_NO_CUDA_TOOLKIT") != "1"
