# SPDX-License-Identifier: Apache-2.0
"""Memory and compute quantities: arbiter/quantity.py and libvgpu's vg_quantity.c agree."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import TEST_BIN
from support.process import clean_env

from arbiter.errors import QuantityError, VgpuError
from arbiter.quantity import (
    MEMORY_FORMS,
    format_memory,
    parse_compute,
    parse_memory,
)

QUANTITY_CLIENT = TEST_BIN / "quantity_client"
KI, MI, GI, TI = 1 << 10, 1 << 20, 1 << 30, 1 << 40
U64_MAX = (1 << 64) - 1
ERROR = None  # expected result of a rejected quantity

# (text, bytes or ERROR); the id is the text itself, made printable.
MEMORY_CASES: list[tuple[str, int | None]] = [
    # happy
    ("1", MI),
    ("512", 512 * MI),
    ("1536Mi", 1536 * MI),
    ("1Ki", KI),
    ("4Ki", 4 * KI),
    ("2Gi", 2 * GI),
    ("1Ti", TI),
    ("1K", 1000),
    ("1M", 10**6),
    ("8G", 8 * 10**9),
    ("2T", 2 * 10**12),
    ("007Gi", 7 * GI),
    ("16383Ti", 16383 * TI),
    ("18446744073709551615K", ERROR),  # digits fit, bytes overflow
    (f"{U64_MAX // MI}", (U64_MAX // MI) * MI),  # largest MiB count that fits
    (f"{U64_MAX // MI + 1}", ERROR),
    ("16777215Ti", 16777215 * TI),
    ("16777216Ti", ERROR),  # exactly 2**64
    ("99999999999999999999999", ERROR),  # digits overflow
    # sad: zero, sign, fraction, whitespace, case, unknown or doubled suffixes
    ("0", ERROR),
    ("0Gi", ERROR),
    ("000", ERROR),
    ("-1", ERROR),
    ("-1Gi", ERROR),
    ("+1Gi", ERROR),
    ("1.5Gi", ERROR),
    (".5", ERROR),
    ("1e3", ERROR),
    ("0x10", ERROR),
    ("1_000", ERROR),
    (" 1Gi", ERROR),
    ("1Gi ", ERROR),
    ("1 Gi", ERROR),
    ("1Gi\n", ERROR),
    ("\t1", ERROR),
    ("", ERROR),
    ("Gi", ERROR),
    ("1gi", ERROR),
    ("1GI", ERROR),
    ("1k", ERROR),
    ("1B", ERROR),
    ("1GB", ERROR),
    ("1GiB", ERROR),
    ("1Pi", ERROR),
    ("1P", ERROR),
    ("1i", ERROR),
    ("1GiGi", ERROR),
    ("1MiK", ERROR),
    ("\u0661", ERROR),  # Arabic-Indic digit one: int() would take it
    ("1Gi\u00a0", ERROR),
]


def _id(text: str) -> str:
    return repr(text)[1:-1] or "<empty>"


def run_client(args: list[str]) -> list[str]:
    """Output lines of the C test program for args."""
    if not QUANTITY_CLIENT.exists():
        pytest.fail(f"{QUANTITY_CLIENT} is missing: run `make build/tests/quantity_client`")
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(TEST_BIN.parent / "simgpu")  # it links simgpu's libcuda
    return subprocess.run([str(QUANTITY_CLIENT), *args], env=env, capture_output=True,
                          text=True, check=True, timeout=30).stdout.splitlines()


def c_parse(texts: list[str]) -> list[int | None]:
    """What vg_parse_quantity says about each text, ERROR where it fails."""
    out = run_client(texts)
    assert len(out) == len(texts), out
    return [None if line == "error" else int(line) for line in out]


def py_parse(text: str) -> int | None:
    """What parse_memory says about text, ERROR for a QuantityError."""
    try:
        return parse_memory(text)
    except QuantityError:
        return ERROR


@pytest.mark.parametrize("parser", ["python", "c"])
@pytest.mark.parametrize(("text", "expected"), MEMORY_CASES, ids=[_id(t) for t, _ in MEMORY_CASES])
def test_parse_memory(parser: str, text: str, expected: int | None) -> None:
    got = py_parse(text) if parser == "python" else c_parse([text])[0]
    assert got == expected


def test_memory_error_names_value_and_forms() -> None:
    with pytest.raises(QuantityError) as info:
        parse_memory("1.5Gi")
    assert str(info.value) == f"invalid memory quantity '1.5Gi': expected {MEMORY_FORMS}"
    assert isinstance(info.value, ValueError) and isinstance(info.value, VgpuError)
    assert (info.value.kind, info.value.value) == ("memory", "1.5Gi")


def test_memory_forms_match_c() -> None:
    assert run_client(["--forms"]) == [MEMORY_FORMS]


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (MI, "1Mi"),
        (1536 * MI, "1536Mi"),
        (2 * GI, "2Gi"),
        (1024 * GI, "1Ti"),
        (3 * KI, "3Ki"),
        (1000, "1K"),
        (10**9, "1G"),
        (1500 * 1000, "1500K"),
        (2048 * 1000, "2000Ki"),  # binary wins when both divide
    ],
    ids=lambda v: str(v),
)
def test_format_memory(nbytes: int, text: str) -> None:
    assert format_memory(nbytes) == text


@pytest.mark.parametrize("nbytes", [0, -MI, 1, 1023, 1500, 1 << 64, True],
                         ids=["zero", "negative", "one-byte", "1023", "1500", "2^64", "bool"])
def test_format_memory_rejects(nbytes: int) -> None:
    with pytest.raises(QuantityError, match="positive multiple of 1000 or 1024 bytes"):
        format_memory(nbytes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2", 2), ("30", 30), ("100", 100), ("050", 50),
     ("0", ERROR), ("1", ERROR), ("101", ERROR), ("-5", ERROR), ("+5", ERROR), ("50%", ERROR),
     ("5.5", ERROR), (" 50", ERROR), ("50\n", ERROR), ("", ERROR), ("fifty", ERROR),
     ("\u0665\u0660", ERROR)],
    ids=_id,
)
def test_parse_compute(text: str, expected: int | None) -> None:
    if expected is ERROR:
        with pytest.raises(QuantityError) as info:
            parse_compute(text)
        assert str(info.value) == (
            f"invalid compute quantity {text!r}: expected an integer percent from 2 to 100")
    else:
        assert parse_compute(text) == expected


@given(st.integers(min_value=1, max_value=U64_MAX))
def test_format_then_parse_round_trips(nbytes: int) -> None:
    # Scale into the representable set: a multiple of 1024 or of 1000.
    for unit in (KI, 1000):
        value = nbytes - nbytes % unit
        if value:
            assert parse_memory(format_memory(value)) == value


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="0123456789KMGTi +-.\tkBx", max_size=8), min_size=1,
                max_size=50))
def test_python_and_c_agree_on_random_strings(texts: list[str]) -> None:
    assert [py_parse(t) for t in texts] == c_parse(texts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=1 << 66),
                          st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T"])),
                min_size=1, max_size=50))
def test_python_and_c_agree_on_numbers(pairs: list[tuple[int, str]]) -> None:
    texts = [f"{n}{suffix}" for n, suffix in pairs]
    assert [py_parse(t) for t in texts] == c_parse(texts)
