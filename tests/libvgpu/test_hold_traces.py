# SPDX-License-Identifier: Apache-2.0
"""The holder's rules for an empty queue, rule by rule, on traces (libvgpu/src/hold.h).

A holder whose queue ran empty keeps the token for the app's next launch or gives it
back. build/tests/hold_trace feeds the pure rules what the holder thread would see:
launches, the work's end (dated by the GPU's clock), the app's syncs and queries and
when they returned, and the holder's looks. A look is made whenever the holder thread
happens to wake: it decides only whether the gap has begun and how long it lasted, both
dated by the app's own calls, so a late look gives the same answer as a prompt one.
Times in us.
"""
from __future__ import annotations

import subprocess

import pytest
from support.paths import TEST_BIN

HOLD_TRACE = TEST_BIN / "hold_trace"

GAP_HOLD_US = 250    # VG_HOLD_GAP_NS
IDLE_HOLD_US = 2000  # VG_HOLD_IDLE_NS


def run(trace: str) -> list[str]:
    out = subprocess.run([str(HOLD_TRACE)], input=trace, capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return out.splitlines()


def test_the_constants_match_the_header() -> None:
    header = (TEST_BIN.parents[1] / "libvgpu" / "src" / "hold.h").read_text()
    assert f"#define VG_HOLD_GAP_NS {GAP_HOLD_US * 1000}ull" in header
    assert f"#define VG_HOLD_IDLE_NS {IDLE_HOLD_US * 1000}ull" in header


@pytest.mark.parametrize(("contended", "hold"), [(1, GAP_HOLD_US), (0, IDLE_HOLD_US)])
def test_an_empty_queue_is_given_back_after_the_hold(contended: int, hold: int) -> None:
    """Give back: 250 us after the work's end while another slice waits, 2 ms while none does."""
    out = run(f"contended {contended}\nlaunch 0\nend 100\n"
              f"look {100 + hold - 1}\nlook {100 + hold}\n")
    assert out == ["keep look=1.000", "give"]


def test_a_late_look_dates_the_gap_from_the_work_not_from_itself() -> None:
    """A holder thread that wakes 1 ms late gives back at once: the gap began at the
    work's end, not when the thread saw it."""
    assert run("contended 1\nlaunch 0\nend 100\nlook 1100\n") == ["give"]


def test_a_sync_that_returns_late_is_not_a_gap() -> None:
    """Gap and wait: an app thread inside a blocking sync keeps the hold; its gap begins
    when the sync returns (600, the host woke it 500 us after the work's end)."""
    out = run("contended 1\nlaunch 0\nsync 10\nend 100\nlook 400\nback 600\n"
              f"look {600 + GAP_HOLD_US - 1}\nlook {600 + GAP_HOLD_US}\n")
    assert out == ["keep look=20.000", "keep look=1.000", "give"]


def test_a_sync_keeps_the_hold_at_most_the_idle_hold() -> None:
    """A sync that never returns (a hung app) keeps a contended hold 2 ms, no longer."""
    out = run(f"contended 1\nlaunch 0\nsync 10\nend 100\nlook {100 + IDLE_HOLD_US - 1}\n"
              f"look {100 + IDLE_HOLD_US}\n")
    assert out == ["keep look=20.000", "give"]


def test_a_poller_kept_off_its_cpu_is_not_a_gap() -> None:
    """Gap and wait for a polling loop: its query found the work running (60), the host then
    kept it off its CPU until 900 (a CPU hog on its core), where a query found the work
    done; it launched 20 us later. It waited all along: the hold is kept, and the 20 us
    are no long gap (so its next sync offers nothing back)."""
    out = run("contended 1\nlaunch 0\nquery 60 busy\nend 100\nlook 400\nquery 900 ready\n"
              "look 1000\nlaunch 1020\n")
    assert out == ["keep look=20.000", "keep look=150.000", "long=0"]


def test_a_query_that_finds_done_work_without_a_poll_dates_nothing() -> None:
    """An app that checks an event it knows is done (no query found it running) does not
    move its gap: the hold is given back 250 us after the work's end."""
    out = run(f"contended 1\nlaunch 0\nend 100\nquery 300 ready\nlook {100 + GAP_HOLD_US}\n")
    assert out == ["give"]


def test_a_launch_after_a_poll_ends_the_wait() -> None:
    """An app that queried (running), then launched more and went to CPU work without
    polling again waits for nothing: its gap counts from its work's end."""
    out = run(f"contended 1\nlaunch 0\nquery 10 busy\nlaunch 20\nend 100\n"
              f"look {100 + GAP_HOLD_US}\n")
    assert out == ["give"]


@pytest.mark.parametrize(("back", "launch", "long"), [
    (None, 100 + GAP_HOLD_US, 0),
    (None, 100 + GAP_HOLD_US + 1, 1),
    (500, 500 + GAP_HOLD_US, 0),
    (500, 500 + GAP_HOLD_US + 1, 1),
])
def test_a_long_gap_is_counted_from_the_later_of_the_work_end_and_the_wait(
        back: int | None, launch: int, long: int) -> None:
    """Long gap: the spell from the work's end (or the sync's return) to the next launch
    marks a step loop once it passes 250 us."""
    sync, wake = ("sync 50\n", f"back {back}\n") if back is not None else ("", "")
    out = run(f"contended 1\nlaunch 0\n{sync}end 100\n{wake}launch {launch}\n")
    assert out == [f"long={long}"]
