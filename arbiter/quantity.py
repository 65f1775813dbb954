# SPDX-License-Identifier: Apache-2.0
"""Memory and compute quantities as DESIGN.md defines them; twin of libvgpu/common/vg_quantity.c."""
from __future__ import annotations

import re

from arbiter.errors import QuantityError

__all__ = [
    "COMPUTE_FORMS",
    "COMPUTE_MAX",
    "COMPUTE_MIN",
    "MEMORY_FORMS",
    "format_memory",
    "parse_compute",
    "parse_memory",
]

#: Same words as VG_QUANTITY_FORMS in vg_quantity.h (tests/arbiter/test_quantity.py checks).
MEMORY_FORMS = (
    "an integer with an optional suffix Ki, Mi, Gi, Ti, K, M, G or T (no suffix = MiB)"
)
COMPUTE_MIN = 2
COMPUTE_MAX = 100
COMPUTE_FORMS = f"an integer percent from {COMPUTE_MIN} to {COMPUTE_MAX}"

_UNITS: dict[str, int] = {
    "": 1 << 20,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
# Largest first: format_memory picks the largest unit that divides exactly,
# binary before decimal.
_FORMAT_UNITS = ("Ti", "Gi", "Mi", "Ki", "T", "G", "M", "K")
# ASCII digits only: int() alone would take "+1", " 1", "1_0" and other scripts' digits,
# which the C parser rejects.
_MEMORY_RE = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?", re.ASCII)
_DIGITS_RE = re.compile(r"[0-9]+", re.ASCII)
_U64_MAX = (1 << 64) - 1


def parse_memory(text: str) -> int:
    """Return the number of bytes a memory quantity such as ``1536Mi`` or ``2G`` names."""
    if not isinstance(text, str):
        raise QuantityError("memory", repr(text), MEMORY_FORMS)
    m = _MEMORY_RE.fullmatch(text)
    if m is None:
        raise QuantityError("memory", text, MEMORY_FORMS)
    n = int(m.group(1))
    value = n * _UNITS[m.group(2) or ""]
    # The C twin holds bytes in a uint64_t.
    if n == 0 or value > _U64_MAX:
        raise QuantityError("memory", text, MEMORY_FORMS)
    return value


def format_memory(nbytes: int) -> str:
    """Return the shortest exact quantity for nbytes, e.g. ``1536Mi`` or ``2Gi``."""
    if isinstance(nbytes, int) and not isinstance(nbytes, bool) and 0 < nbytes <= _U64_MAX:
        for suffix in _FORMAT_UNITS:
            n, rest = divmod(nbytes, _UNITS[suffix])
            if rest == 0:
                return f"{n}{suffix}"
    raise QuantityError("memory", str(nbytes), "a positive multiple of 1000 or 1024 bytes")


def parse_compute(text: str) -> int:
    """Return the compute share a quantity such as ``30`` names, in percent."""
    if not isinstance(text, str) or _DIGITS_RE.fullmatch(text) is None:
        raise QuantityError("compute", text if isinstance(text, str) else repr(text),
                            COMPUTE_FORMS)
    value = int(text)
    if not COMPUTE_MIN <= value <= COMPUTE_MAX:
        raise QuantityError("compute", text, COMPUTE_FORMS)
    return value
