# SPDX-License-Identifier: Apache-2.0
"""tests/support/prereq.py and the ABI suite's rule: a missing prerequisite skips, in CI it
fails."""
from __future__ import annotations

import pytest
from support.prereq import cuda_headers_expected, in_ci, require


@pytest.mark.parametrize(("value", "ci"), [
    (None, False), ("", False), ("0", False), ("false", False), ("No", False),
    ("true", True), ("1", True), ("yes", True), ("TRUE", True),
], ids=lambda v: repr(v))
def test_in_ci(value, ci) -> None:
    assert in_ci({} if value is None else {"CI": value}) is ci


def test_require_goes_on_skips_or_fails() -> None:
    require(True, "never said", {"CI": "true"})
    with pytest.raises(pytest.skip.Exception, match=r"^needs root$"):
        require(False, "needs root", {})
    with pytest.raises(pytest.fail.Exception,
                       match=r"^needs root \(CI=true: a contract suite must run here"):
        require(False, "needs root", {"CI": "true"})


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, False),
    ({"CI": "true"}, True),
    ({"CI": "true", "VGPU_NO_CUDA_TOOLKIT": "1"}, False),
    ({"CUDA_HOME": "/opt/cuda"}, True),
    ({"CUDA_PATH": "/opt/cuda", "CI": "false"}, True),
], ids=["developer", "ci", "ci-without-toolkit", "cuda-home", "cuda-path"])
def test_when_cuda_headers_are_expected(environ, expected) -> None:
    assert cuda_headers_expected(environ) is expected
