# SPDX-License-Identifier: Apache-2.0
"""The order `make test` hands files to pytest-xdist's workers names files that exist."""
from __future__ import annotations

from pathlib import Path

import conftest

TESTS = Path(conftest.__file__).parent


def test_every_file_sent_first_exists() -> None:
    missing = [name for name in conftest.SLOW_FIRST if not (TESTS / name).is_file()]
    assert missing == [], f"tests/conftest.py SLOW_FIRST names files that are gone: {missing}"
    assert len(set(conftest.SLOW_FIRST)) == len(conftest.SLOW_FIRST)
