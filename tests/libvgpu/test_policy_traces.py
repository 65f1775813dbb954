# SPDX-License-Identifier: Apache-2.0
"""The broker's rules, one trace each (libvgpu/src/policy.c; docs/compute.md, "Rules").

build/tests/policy_trace plays the pure policy as a perfect broker: it looks at every line's
time (the slice rang) and whenever its last look asked to look again, and plays each slice's
libvgpu as far as the trace leaves it to it (a waiter renews its request and takes a grant
at once, a holder renews its lease). What comes out is every decision and charge, in ms
(the program's header comment has the language). No clock, no process, no timing: the
numbers are exact, and a rule that changes changes them.
"""
from __future__ import annotations

import subprocess
import textwrap

import pytest
from support.paths import TEST_BIN

POLICY_TRACE = TEST_BIN / "policy_trace"


def play(trace: str) -> list[str]:
    """The decisions and charges of a trace, one line each, without the accounting."""
    return [line for line in _run(trace) if " account " not in line]


def accounts(trace: str) -> dict[str, dict[str, float]]:
    """Each slice's accounting at the trace's `end`: used, credit (ms), holds, waiting."""
    out: dict[str, dict[str, float]] = {}
    for line in _run(trace):
        _, kind, name, *fields = line.split()
        if kind == "account":
            out[name] = {k: float(v) for k, v in (f.split("=") for f in fields)}
    return out


def _run(trace: str) -> list[str]:
    return subprocess.run([str(POLICY_TRACE)], input=textwrap.dedent(trace), capture_output=True,
                          text=True, check=True, timeout=10).stdout.splitlines()


def behind_a_revoked_tail(events: str) -> list[str]:
    """A fixed 50 % holds greedily and is revoked when its credit runs out (4.009); the burst
    b, waiting since 1, is granted then and gives its hold back at 6. `events`: what a's
    tail and b's claims do in between (lines of the trace language, in time order)."""
    lines = play("""
        0 a settings share=50
        0 b settings share=50 policy=burst
        0 a greedy
        1 b want
    """ + textwrap.dedent(events) + """
        6 b release
        8 - end
    """)
    assert lines[:3] == ["0.000 grant a", "4.009 end a credit", "4.009 grant b"]
    return lines


# ---- credit ----

def test_a_fixed_slice_waits_for_credit() -> None:
    """refill, min hold: a fixed slice earns credit at its share of wall time and takes the
    token only on credit: 1 ms of it while it is the only active slice (it starts with 2 ms);
    its hold ends when the credit is spent."""
    assert play("""
        0 a settings share=10
        0 a want tail=0
        3 a want
        20 - end
    """) == [
        "0.000 grant a",          # the 2 ms it starts with, and 10 % of the hold's time
        "2.240 end a credit",
        "2.240 charge a 2.240",
        "12.400 grant a",         # -0.016 ms at 2.24, +10 % a ms: 1 ms at 12.4
        "13.520 end a credit",
        "13.520 charge a 1.120",
    ]


def test_a_fixed_slice_waits_for_2ms_of_credit_beside_an_active_slice() -> None:
    """min hold: while another slice is active a fixed slice waits for 2 ms of credit (fewer
    hand-overs); a burst neighbour that holds with no credit of its own gives way to it."""
    out = play("""
        0 a settings share=10
        0 b settings share=50 policy=burst
        0 a want tail=0
        3 a want
        3 b greedy tail=0
        30 - end
    """)
    assert out[:7] == [
        "0.000 grant a",
        "2.240 end a credit",
        "2.240 charge a 2.240",
        "3.000 grant b",
        "22.400 end b owes",      # a has 2 ms again: -0.016 + 10 % of 20.16 ms
        "22.400 grant a",
        "22.400 charge b 19.400",
    ]


def test_a_fixed_slice_with_long_tails_waits_for_credit_worth_them() -> None:
    """min hold, scaled by the tail: a fixed slice whose revoked holds drained 3 ms late waits
    for 4 x 3 ms x (1 - its 50 %) = 6 ms of credit, not 2, so its holds last 12 ms instead of
    8 and cost half the hand-overs (each revoked tail runs alongside the next holder's work on
    a GPU that time-slices contexts, which loses a switch per time slice)."""
    trace = """
        0 a settings share=50 policy=burst
        0 b settings share=50
        0 b greedy tail={tail}
        0.5 a greedy tail=0
        40 - end
    """
    assert play(trace.format(tail=0))[3:10] == [
        "4.017 charge b 4.017",
        "12.037 end a owes",
        "12.037 grant b",       # on 2 ms of credit
        "12.037 charge a 8.020",
        "20.049 end b credit",  # an 8 ms hold
        "20.049 grant a",
        "20.049 charge b 8.012",
    ]
    assert play(trace.format(tail=3))[3:10] == [
        "7.017 charge b 7.017",  # its 3 ms tail
        "22.037 end a owes",
        "22.037 grant b",        # on 6 ms of credit
        "22.037 charge a 15.020",
        "34.049 end b credit",   # a 12 ms hold
        "34.049 grant a",
        "37.049 charge b 15.012",
    ]


def test_credit_is_capped_at_20ms() -> None:
    """credit cap: an idle slice banks at most 20 ms; a fixed slice then holds alone until
    it has spent them and what it earns meanwhile (20 / (1 - 50 %) = 40 ms)."""
    trace = """
        0 a settings share=50
        100 - account
        100 a want tail=0
        160 - end
    """
    assert "100.000 account a used=0.000 credit=20.000 holds=0 waiting=0" in _run(trace)
    assert play(trace)[:3] == ["100.000 grant a", "140.001 end a credit", "140.001 charge a 40.001"]


@pytest.mark.parametrize(("drain", "cap"), [(4, "20.000"), (10, "28.504"), (40, "50.000")])
def test_a_slice_with_long_tails_banks_its_quantum(drain: int, cap: str) -> None:
    """credit cap, by tail: a slice whose revoked hold (ended at 2.874) drained 1.1, 7.1 or
    37.1 ms later banks up to its quantum, 4 tails (at most 50 ms), when that is more than
    20 ms: a fixed slice of launches longer than the cap earns a launch's worth while its
    neighbour's long launch runs (at 20 ms, two fixed slices of 50 ms launches both waited
    for credit the cap had taken: a 30:70 split got 29.8 and 66.6 %, the GPU 3.6 % idle)."""
    trace = f"""
        0 a settings share=30
        0 a want
        {drain} a drain at={drain}
        1000 - account
        1100 - end
    """
    assert any(line.startswith("1000.000 account a ") and f"credit={cap} " in line
               for line in _run(trace))


def test_a_fixed_slice_owes_a_long_kernel_in_full() -> None:
    """fixed debt: a fixed 30 % slice whose one launch ran 1 s (revoked at once, its tail
    reported drained a second later) owes all of it and waits until it has earned it back
    (it owed at most 200 ms before, and a fixed 30 % slice of 1 s kernels got 40 %)."""
    trace = """
        0 a settings share=30
        0 a want
        1000 a drain
        1000 - account
        1001 a want
        4000 - end
    """
    assert "1000.000 account a used=1000.000 credit=-698.000 holds=1 waiting=0" in _run(trace)
    assert play(trace)[4] == "3330.000 grant a"


def test_a_tail_never_reported_gets_back_nothing_the_cap_took() -> None:
    """fixed debt, cap: what the cap took while a launch ran on is given back only with its
    drain report; a tail never reported keeps only the capped credit (a tenant cannot bank
    credit by never reporting)."""
    trace = """
        0 a settings share=30
        0 a want
        1000 - account
        1100 - end
    """
    # 50: the cap of a slice whose tail was the broker's whole wait (credit cap, by tail).
    assert "1000.000 account a used=52.874 credit=50.000 holds=1 waiting=0" in _run(trace)


def test_a_burst_slice_takes_idle_time_and_owes_at_most_the_debt_cap() -> None:
    """burst, debt cap: a burst slice holds the idle GPU beyond its share, and owes at most
    20 ms for it: 100 ms used at 20 % leaves it -20 ms, which it earns back at its share."""
    trace = """
        0 b settings share=20 policy=burst
        0 b want
        100 b release
        100 - account
        150 - end
    """
    assert play(trace) == ["0.000 grant b", "100.000 end b released", "100.000 charge b 100.000"]
    lines = _run(trace)
    assert "100.000 account b used=100.000 credit=-20.000 holds=1 waiting=0" in lines
    assert accounts(trace)["b"]["credit"] == -10.0


# ---- priority and floor ----

def test_a_higher_priority_preempts_and_the_lower_resumes_once_it_is_quiet() -> None:
    """priority: a slice of higher priority that asks ends a lower one's hold at once; the
    lower one may hold again once the higher has not been active for 5 ms (the broker sees
    that at its next look, at most a beat, 10 ms, after the higher's last activity)."""
    assert play("""
        0 lo settings share=50 prio=low policy=burst
        0 hi settings share=50 prio=high policy=burst
        10 lo greedy tail=0
        15 hi want tail=0
        20 hi release
        40 - end
    """) == [
        "10.000 grant lo",
        "15.000 end lo outranked",
        "15.000 grant hi",
        "15.000 charge lo 5.000",
        "20.000 end hi released",
        "20.000 charge hi 5.000",
        "30.000 grant lo",
    ]


def test_a_floor_beats_priority() -> None:
    """floor: a lower-priority slice with a floor earns floor credit at its floor; once it has
    2 ms of it, it takes the token from a higher priority, and holds until it spent it."""
    assert play("""
        0 lo settings share=50 prio=low floor=20
        0 hi settings share=50 prio=high policy=burst
        0 hi greedy tail=0
        0 lo greedy tail=0
        30 - end
    """) == [
        "0.000 grant hi",
        "10.000 end hi floor",        # 20 % of 10 ms: 2 ms of floor credit
        "10.000 grant lo",
        "10.000 charge hi 10.000",
        "13.000 end lo floor-spent",  # 2 ms + 20 % of 3 ms, spent at 100 %, seen at a look
        "13.000 grant hi",
        "13.000 charge lo 3.000",
        "25.000 end hi floor",
        "25.000 grant lo",
        "25.000 charge hi 12.000",
        "28.000 end lo floor-spent",
        "28.000 grant hi",
        "28.000 charge lo 3.000",
    ]


# ---- how long a hold lasts ----

def test_a_holder_yields_to_an_equal_claim_after_the_quantum() -> None:
    """quantum: a holder with credit keeps the token for 10 ms while a slice of equal
    priority waits with a better claim, then gives way."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10
        0 a want tail=0
        0 b want tail=0
        30 - end
    """)[:4] == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "10.000 charge a 10.000",
    ]


QUANTUM_AFTER_A_TAIL = """
    0 a settings share={share} policy=burst
    0 b settings share={other}
    0 a want tail={tail}
    0 b want tail=0
    {again} a want
    {again} b want
    {till} - end
"""


def test_a_slice_with_long_tails_keeps_the_token_four_tails_long() -> None:
    """quantum, scaled by the tail: once a's revoked hold drained 4 ms after it ended, a
    keeps the token 4 x 4 = 16 ms beside an equal waiter, not 10 (its hand-overs cost the GPU
    its tails: fewer of them); with 6 ms tails the cap margin ends its hold first."""
    def hold_end(tail: int) -> str:
        out = play(QUANTUM_AFTER_A_TAIL.format(share=90, other=10, tail=tail, again=300, till=400))
        return next(line for line in out if line.startswith("3") and " end a " in line)
    assert hold_end(0) == "310.000 end a quantum"
    assert hold_end(4) == "316.000 end a quantum"
    assert hold_end(6) == "321.000 end a cap"


def test_the_quantum_a_tail_buys_is_at_most_the_longest_tail() -> None:
    """quantum bound: a slice whose tail was 15 ms (or that reports its drains 15 ms late)
    holds at most 50 ms, the longest tail the broker waits for, not 60; the waiter banks
    what it earns meanwhile (here a 2 % slice: 21.75 ms charged, not 20.62)."""
    def hold(tail: int) -> list[str]:
        out = play(QUANTUM_AFTER_A_TAIL.format(share=98, other=2, tail=tail, again=2000, till=2200))
        return [line for line in out if line.startswith("20")]
    assert hold(0)[:2] == ["2000.000 grant a", "2010.000 end a quantum"]
    assert hold(15)[:2] == ["2000.000 grant a", "2050.000 end a quantum"]
    assert hold(15)[-1] == "2086.754 charge b 21.754"
    assert hold(0)[-1] == "2030.620 charge b 20.620"


def test_a_waiter_losing_credit_to_the_cap_goes_first() -> None:
    """cap margin: a waiter whose credit is within 2 ms of the 20 ms cap takes the token from a
    holder whose credit is not, at once instead of at the quantum (it would lose what it
    earns meanwhile: a step loop's share drained into the cap)."""
    assert play("""
        0 a settings share=50
        0 b settings share=50
        45 a greedy tail=0
        50 b want tail=0
        70 - end
    """)[:4] == ["45.000 grant a", "50.000 end a cap", "50.000 grant b", "50.000 charge a 5.000"]


def test_a_waiter_keeps_what_it_earns_while_a_capped_holder_runs_down() -> None:
    """wait bank: when the holder is near the cap too, the waiter waits until the holder's
    credit is not (here 4 ms); what it earns meanwhile is banked, up to a quantum past the
    cap, not lost to it (at the bare cap a step loop beside a greedy neighbour lost part of
    every wait: 48-49 % of a fixed 50 %, 46-48 % with late wake-ups)."""
    trace = """
        0 a settings share=50
        0 b settings share=50
        45 a greedy tail=0
        45.5 b want tail=0
        49 - account
        60 - end
    """
    assert "49.000 account b used=0.000 credit=21.500 holds=0 waiting=1" in _run(trace)
    assert play(trace)[:3] == ["45.000 grant a", "49.500 end a cap", "49.500 grant b"]


def test_what_a_waiter_banks_is_bounded_by_a_quantum() -> None:
    """wait bank: a waiter that cannot get the token for long (a higher priority holds it)
    banks at most the cap plus the holder's quantum, 30 ms."""
    trace = """
        0 h settings share=50 prio=high policy=burst
        0 l settings share=50
        0 h greedy
        0 l want
        200 - end
    """
    assert accounts(trace)["l"]["credit"] == 30.0


def test_the_switch_before_a_holds_first_kernel_is_not_its_own() -> None:
    """start claim: a hold's work first runs after the GPU switched to its context (~150 us
    on an H200, where every hand-over cost a fixed 50 % slice 4-7 points when it was
    charged); its slice claims when that was (start_ns, dated by its first start event),
    and the time before is deducted like idle."""
    assert play("""
        0 a settings share=50 policy=burst
        0 b settings share=50 policy=burst
        0 a want
        0.5 b want
        2 a release
        2.2 b claim start_seq=1 start_ns=2.15
        4 b release
        6 - end
    """)[-1] == "4.000 charge b 1.850"


def test_a_start_claim_behind_a_revoked_tail_counts_from_the_tails_end() -> None:
    """start claim: behind a revoked holder's tail the hold is charged from the tail's end
    (tail), and its start claim deducts only the switch after it, not the tail again."""
    lines = behind_a_revoked_tail("""
        5 a drain at=4.5
        5 b claim start_seq=1 start_ns=4.65
    """)
    assert lines[3] == "5.000 charge a 4.500"
    assert "6.000 charge b 1.350" in lines


def test_a_launch_after_the_previous_tail_is_charged_from_the_launch() -> None:
    """launch claim: the hold's first launch found its queue empty at 4.7 (its start event
    completed as it was recorded), after a's tail had drained at 4.5: the GPU sat idle
    between the two, and b is charged from its launch. (When libvgpu claimed that first
    gap in idle_ns, from the grant at 4.009, the tail a pays was deducted from b again: a
    fixed 10 % beside a fixed 90 % got 10.3 %, the 90 % 89.5.)"""
    lines = behind_a_revoked_tail("""
        5 a drain at=4.5
        5 b claim launch_seq=1 launch_ns=4.7
    """)
    assert lines[3] == "5.000 charge a 4.500"
    assert "6.000 charge b 1.300" in lines


def test_a_launch_while_the_previous_tail_runs_shares_none_of_it() -> None:
    """launch claim: a launch onto an empty queue at 4.2 says only that b's work ran no
    earlier; a GPU that runs contexts one after the other (simgpu's default engine) ran it
    after a's tail, which drained at 5.0. So a pays its tail in full and b is charged from
    5.0: unlike a start claim (shared tail), a launch claim is no proof that b's work ran
    alongside the tail."""
    lines = behind_a_revoked_tail("""
        4.2 b claim launch_seq=1 launch_ns=4.2
        5.2 a drain at=5.0
    """)
    assert lines[3] == "5.200 charge a 5.000"
    assert "6.000 charge b 1.000" in lines


def test_a_launch_claim_of_another_hold_is_not_believed() -> None:
    """launch claim: believed only for the hold it names and within it (a claim of hold 1
    read in hold 2, or dated before the grant, deducts nothing)."""
    lines = play("""
        0 a settings share=50 policy=burst
        0 a want
        1 a release
        2 a want
        2.5 a claim launch_seq=1 launch_ns=2.4
        3 a release
        4 a want
        4.5 a claim launch_seq=3 launch_ns=3.5
        5 a release
        6 - end
    """)
    assert "3.000 charge a 1.000" in lines
    assert "5.000 charge a 1.000" in lines


def test_a_tail_the_next_holder_ran_alongside_is_paid_half_each() -> None:
    """shared tail: on a GPU that time-slices between contexts, the next holder's work runs
    in turns with a revoked hold's tail (its start claim, 4.2, is before the tail's end,
    5.0): each had half of those 0.8 ms, so the tail's slice pays 4.6 and the next hold is
    charged from 4.6 (charged from 5.0, a fixed 30 % beside a greedy neighbour with 5 ms
    kernels got 20 % on simgpu's time-sliced engine, and the neighbour its work for free)."""
    lines = behind_a_revoked_tail("""
        4.2 b claim start_seq=1 start_ns=4.2
        5.2 a drain at=5.0
    """)
    assert lines[3] == "5.200 charge a 4.600"
    assert "6.000 charge b 1.400" in lines


@pytest.mark.parametrize(("turn", "b_paid", "back"), [(4.9, 1.7, 0.3), (5.5, 1.8, 0.4),
                                                      (4.5, 1.4, None)])
def test_a_first_turn_longer_than_half_the_overlap_is_paid_by_its_hold(
        turn: float, b_paid: float, back: float | None) -> None:
    """first turn: a GPU that time-slices contexts lets the tail's owner end its turn, then
    runs the next holder's first turn whole, then the tail's rest. b's own claim says its
    first turn ran from its start (4.2) to 4.9, so of the 0.8 ms overlap it had 0.7, not
    half: it pays 0.3 more and a gets 0.3 back when b's hold settles. A turn claimed past
    the tail's end counts to that end (the most b can take on is the whole overlap); one
    shorter than half changes nothing, as no claim does (a claim only costs its maker).
    Without this, a fixed 30 % beside a greedy burst (100 us kernels, 1 ms turns) was
    charged 1.07 times what it ran."""
    lines = behind_a_revoked_tail(f"""
        4.2 b claim start_seq=1 start_ns=4.2
        5.2 a drain at=5.0
        5.3 b claim turn_seq=1 turn_ns={turn}
    """)
    assert lines[3] == "5.200 charge a 4.600"
    assert f"6.000 charge b {b_paid:.3f}" in lines
    refunds = [line for line in lines if " refund " in line]
    assert refunds == ([f"6.000 refund a {back:.3f}"] if back else [])


def test_a_late_tail_the_next_holder_ran_alongside_is_paid_half_each() -> None:
    """shared tail, past the broker's wait: a tail of one long launch (here 2.874-65 ms,
    time-sliced with b's work from b's start claim at 3.2) is charged the 50 ms wait when
    it is not reported by then, and b is charged from its grant: both paid the overlap in
    full. The drain report settles it: a pays 65 less half of [3.2, 65) (a refund of what
    the wait charged beyond that), and b's hold is charged that half less when it ends, so
    the two add up to the 75 ms of wall time (a 50 ms kernel of a fixed 30 % beside a greedy
    burst, time-sliced, got 15.5 %)."""
    trace = """
        0 a settings share=30
        0 b settings share=70 policy=burst
        0 a want
        1 b greedy tail=0
        4 b claim start_seq=1 start_ns=3.2
        70 a drain at=65
        75 b release
        80 - end
    """
    lines = play(trace)
    assert lines[:7] == ["0.000 grant a", "2.874 end a credit", "2.874 grant b",
                         "52.874 charge a 52.874", "70.000 refund a 18.774",
                         "75.000 end b released", "75.000 grant b"]
    assert "75.000 charge b 40.900" in lines
    used = accounts(trace)
    assert used["a"]["used"] + used["b"]["used"] == pytest.approx(75.0, abs=0.01)


LATE_TAIL_AHEAD = """
    0 a settings share=50 policy=burst
    0 b settings share=50 policy=burst
    0 b want
    5 a want
    {claims}
    510 b drain at={drain}
    600 a release
    700 - end
"""


def test_a_hold_queued_behind_a_late_tail_is_charged_from_its_drain() -> None:
    """late tail ahead: b's tail of one long launch is settled unreported at 55 (charged
    the 50 ms wait) and reported drained at 500. a's hold, granted at 5 and queued behind
    it, could run only from 500 and is charged from there, as behind a tail reported in
    time (without this it paid 595 for 100 of work: b's tail twice)."""
    assert play(LATE_TAIL_AHEAD.format(claims="", drain=500)) == [
        "0.000 grant b", "5.000 end b owes", "5.000 grant a", "55.000 charge b 55.000",
        "510.000 charge b 445.000", "600.000 end a released", "600.000 charge a 100.000"]


def test_a_late_report_dated_within_the_wait_still_dates_the_hold_behind_it() -> None:
    """late tail ahead: b's tail is one launch about as long as the broker's wait (a 50 ms
    kernel): it drains at 54.9, just before the wait ends at 55, and the report comes at
    56, after the broker settled it unreported. b keeps paying the wait; a, granted at 5 and
    queued behind that tail, ran from 54.9 and is charged from there (without this the
    report was dropped and a paid 150 for 100.1 of work: b's wait twice; on simgpu a 50 ms
    burst beside a fixed 30 % was charged 1.10-1.22 times what it ran)."""
    trace = """
        0 a settings share=50 policy=burst
        0 b settings share=50 policy=burst
        0 b want
        5 a want
        56 b drain at=54.9
        155 a release
        200 - end
    """
    assert play(trace) == ["0.000 grant b", "5.000 end b owes", "5.000 grant a",
                           "55.000 charge b 55.000", "155.000 end a released",
                           "155.000 charge a 100.100"]


@pytest.mark.parametrize("drain", [30, 56, 300, 500, 9000], ids=lambda v: f"drain-at-{v}")
def test_a_late_tails_drain_date_moves_no_more_onto_the_next_holder_than_silence(
        drain: int) -> None:
    """hostile, late tail ahead: b's one long launch ran from 0 to 500, a's work from 500 to
    600. Whatever b's drain report says (30, within the broker's wait; 56, just past it;
    300; the truth; the future, not believed), a pays at most what it pays when b never
    reports (595, from its grant), b at least the 50 ms wait, and the 600 ms the GPU ran
    are all paid: a false date only takes back from a what the truth would have given it."""
    used = accounts(LATE_TAIL_AHEAD.format(claims="", drain=drain))
    a, b = used["a"]["used"], used["b"]["used"]
    assert a <= 595 and b >= 55 and a + b >= 600, (a, b)
    if drain == 500:
        assert (a, b) == (100.0, 500.0)


def test_a_false_start_claim_behind_a_late_tail_costs_only_its_maker() -> None:
    """hostile, shared tail: a claims its work first ran at 6, alongside b's late tail,
    though it ran only once that drained at 500. It pays half of the overlap on top of its
    100 and b half less: a start claim moves charge only onto the slice that makes it."""
    used = accounts(LATE_TAIL_AHEAD.format(claims="6 a claim start_seq=1 start_ns=6", drain=500))
    assert (used["a"]["used"], used["b"]["used"]) == (347.0, 253.0)


def test_a_chain_of_late_tails_is_charged_in_gpu_order() -> None:
    """late tail ahead: a fixed 30 % asks while b's 1 s launch runs; b is revoked, a granted,
    and a's hold ends on credit (3 ms, its own 1 s launch queued behind b's). Both tails
    outlast the broker's wait and are settled unreported. b reports its drain at 700; a's
    launch ran from there to 1700, and a pays 1000 in all, what it paid when its tail was
    settled included (without this it paid 1600: a 1 s kernel of a fixed 30 % beside a
    greedy burst got 20-25 %)."""
    trace = """
        0 a settings share=30
        0 b settings share=70 policy=burst
        0 b want
        100 a want
        700 b drain at=700
        1700 a drain at=1700
        1800 - end
    """
    assert play(trace) == ["0.000 grant b", "100.000 end b owes", "100.000 grant a",
                           "128.591 end a credit", "150.000 charge b 150.000",
                           "178.591 charge a 78.591", "700.000 charge b 550.000",
                           "1700.000 charge a 921.409"]
    used = accounts(trace)
    assert (used["a"]["used"], used["b"]["used"]) == (1000.0, 700.0)


def test_a_late_tail_and_the_late_tail_alongside_it_pay_half_each() -> None:
    """shared tail, both late: b's tail of one long launch and a's, time-sliced together from
    a's start claim at 100.5, both outlast the broker's wait. The overlap runs until b's
    tail drained (300), not until a's hold ended (128.6): a's work ran on as its own tail.
    Each pays half of [100.5, 300), and the two add up to the 350 ms of wall time (without
    this they paid 521: a 50 ms kernel of a fixed 30 % beside a greedy burst, time-sliced,
    got 23 %)."""
    trace = """
        0 a settings share=30
        0 b settings share=70 policy=burst
        0 b want
        100 a want
        101 a claim start_seq=1 start_ns=100.5
        300 b drain at=300
        350 a drain at=350
        400 - end
    """
    assert play(trace)[3:] == ["128.573 end a credit", "150.000 charge b 150.000",
                               "178.573 charge a 78.073", "300.000 charge b 50.250",
                               "350.000 charge a 71.677"]
    used = accounts(trace)
    assert (used["a"]["used"], used["b"]["used"]) == (149.75, 200.25)


def test_a_late_tail_that_no_hold_followed_yet_is_shared_with_the_next_grant() -> None:
    """shared tail, no hold after it yet: a's hold of one 1 s launch ends on its credit at
    2.9 while nobody waits (both slices blocked behind their own long launches), so its
    tail is settled unreported at 52.9 with no hold after it. b is granted at 100 and its
    start claim says its work ran alongside that tail: the two pay half of [100.5, 1100)
    each and add up to the 1200 ms of wall time. Without this, each paid the overlap in
    full (2199.5 for 1200: time-sliced, a fixed 30 % of 1 s launches beside a burst got
    27.6 %, and the burst's launches were charged 1.4 s each)."""
    trace = """
        0 a settings share=30
        0 b settings share=70 policy=burst
        0 a want
        100 b want
        101 b claim start_seq=1 start_ns=100.5
        1100 a drain at=1100
        1200 b release
        1300 - end
    """
    assert play(trace) == ["0.000 grant a", "2.874 end a credit", "52.874 charge a 52.874",
                           "100.000 grant b", "1100.000 charge a 547.376",
                           "1200.000 end b released", "1200.000 charge b 599.750"]
    used = accounts(trace)
    assert (used["a"]["used"], used["b"]["used"]) == (600.25, 599.75)


def test_a_start_claim_is_deducted_within_the_idle_cap() -> None:
    """start claim, cap: a start claimed at the hold's very end while another slice waited
    deducts no more than idle could: a quarter of the contended span."""
    lines = play("""
        0 a settings share=50 policy=burst
        0 b settings share=50 policy=burst
        0 a want
        0 b greedy
        4 a claim start_seq=1 start_ns=3.99
        4 a release
        8 - end
    """)
    assert "4.000 charge a 3.000" in lines


def test_other_processes_of_the_holders_slice_take_turns_after_the_quantum() -> None:
    """turn: past the quantum, a hold ends when another process of the same slice waits (it
    is granted anew); the broker sees it at its next look, a beat after the last."""
    assert play("""
        0 a settings share=50 policy=burst
        0 a want
        3 a want
        20 - end
    """) == ["0.000 grant a", "13.000 end a turn", "13.000 grant a"]


def test_a_lapsed_lease_loses_the_token() -> None:
    """lease: a holder whose processes stop renewing its lease (killed, stopped) loses the
    token 50 ms after the last renewal, even to a lower priority that could not take it
    otherwise. Its last renewal was at the broker's look at 9 ms (one a ms while b waits)."""
    assert play("""
        0 a settings share=50 policy=burst
        0 b settings share=50 prio=low policy=burst
        0 a want
        1 b want
        10 a silence
        80 - end
    """) == ["0.000 grant a", "60.000 end a lease", "60.000 grant b"]


def test_a_grant_nobody_takes_is_taken_back_and_charged_as_held() -> None:
    """untaken: a grant no process of the slice takes within 5 ms (a request that was a lie,
    or a waiter gone) is taken back, and its slice pays the 5 ms."""
    assert play("""
        0 a settings share=50 policy=burst
        30 b settings share=10 policy=burst
        40 a want notake
        41 a stop
        41 b want
        60 - end
    """) == ["40.000 grant a", "45.000 end a untaken", "45.000 grant b", "45.000 charge a 5.000"]


def test_a_yield_offer_ends_the_hold_only_when_someone_waits() -> None:
    """yield: a holder that offers its hold back (it syncs, CPU work follows) keeps it while
    nobody waits; the offer stands, and the hold ends as soon as a slice waits. Its queued
    work runs out as a revoked tail, charged to it until it reports the drain."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        2 a yield
        4 b want
        6 a drain
        8 b release
        20 - end
    """) == [
        "0.000 grant a",
        "4.000 end a yielded",
        "4.000 grant b",
        "6.000 charge a 6.000",   # 4 ms held + its 2 ms tail
        "8.000 end b released",
        "8.000 charge b 2.000",   # b's work ran from a's drain, 6 to 8
    ]


# ---- tails and drains ----

def test_a_revoked_tail_is_charged_until_the_drain_report() -> None:
    """tail: the work a revoked holder had queued runs on after the revocation and is its
    own until it reports the drain; the next holder's work, queued behind it, is charged
    from then."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        14 a drain
        16 b release
        30 - end
    """) == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "14.000 charge a 14.000",
        "16.000 end b released",
        "16.000 charge b 2.000",
    ]


def test_an_unreported_tail_costs_the_max_tail_and_does_not_hold_back_the_next_holder() -> None:
    """max tail: a revoked hold whose drain is never reported is settled 50 ms after its
    tail began and charged those 50 ms; the hold behind it is charged from its own grant.
    A drain reported later pays the rest of a tail that was longer."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        13 b release
        80 a drain at=75
        90 - end
    """) == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "13.000 end b released",
        "60.000 charge a 60.000",   # 10 held + 50 of tail
        "60.000 charge b 3.000",    # 10 to 13: not held back behind a's tail
        "80.000 charge a 15.000",   # its tail ran 25 ms more, to 75
    ]


def test_a_hold_given_back_as_it_was_revoked_needs_no_drain_report() -> None:
    """crossing: a slice that gives its hold back (queue drained) just as the broker takes
    it has nothing queued; its release dates the end, no drain report is waited for."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        10.1 a claim release_seq=1 release_ns=10.1
        20 - end
    """)[:4] == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "10.100 charge a 10.100",
    ]


def test_holds_settle_in_gpu_order() -> None:
    """GPU order: holds run on the GPU one after another, so each is settled after the one
    before it: a hold released before an earlier tail's drain is reported waits for it, and
    is charged from when that tail ended (when its own work could start)."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        16 b release
        18 a drain at=12
        30 - end
    """) == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "16.000 end b released",     # not settled yet: a's tail is ahead of it
        "18.000 charge a 12.000",
        "18.000 charge b 4.000",     # 12 to 16
    ]


def test_each_hold_is_settled_by_its_own_drain_report_latched_when_first_seen() -> None:
    """latch: a slice reports only its latest drain. Each revoked hold latches its report
    the moment the broker sees it, so b's second report (over the first) cannot leave its
    first hold, queued behind h's unreported tail, without one: b pays its 4 ms, not a
    50 ms tail of its own."""
    assert play("""
        0 h settings share=50 policy=burst
        0 b settings share=25 policy=burst
        0 c settings share=25 policy=burst
        0 h want
        1 b want
        1 h yield
        2 c want
        2 b yield
        3 b drain
        3 b want
        3 c release
        4 c want
        4 b yield
        5 b drain
        5 c release
        100 - end
    """)[-3:] == [
        "5.000 end c released",
        "51.000 charge h 51.000",
        "51.000 charge b 4.000",     # 1-3 and 3-5; c's holds ran 0 ms behind b's tails
    ]


def test_holds_behind_an_unreported_tail_keep_their_charge_when_the_queue_fills() -> None:
    """room: the broker keeps at most 8 holds unsettled. A ninth grant settles the oldest,
    an unreported tail, charging it its tail so far; the holds behind it are charged from
    their own grants (their GPU time is not lost)."""
    trace = "0 h settings share=90 policy=burst\n0 b settings share=10 policy=burst\n"
    trace += "0 h want\n0 b want\n"
    for k in range(8):
        trace += f"{11 + 2 * k} b release\n{12 + 2 * k} b want\n"
    out = play(trace + "100 - end\n")
    assert out[out.index("24.000 grant b") + 1:][:2] == [
        "24.000 charge h 24.000",    # 10 held + 14 of tail
        "24.000 charge b 7.000",     # its 7 holds of 1 ms
    ]


def test_a_slice_that_leaves_takes_its_unsettled_time_with_it() -> None:
    """gone: a slice that leaves is forgotten with its unsettled holds (nobody pays them);
    the holds behind them are charged from their own grants."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        12 b release
        14 a leave
        30 - end
    """) == [
        "0.000 grant a",
        "10.000 end a quantum",
        "10.000 grant b",
        "12.000 end b released",
        "14.000 charge b 2.000",
    ]


# ---- what a holder claims ----

def test_claimed_idle_is_honoured_in_full_while_nobody_waits() -> None:
    """idle: the time a holder's queue sat empty is not charged, in full while no other slice
    waits: 10 ms held, empty 2-6, 6 ms charged."""
    assert play("""
        0 a settings share=50 policy=burst
        0 a want
        2 a empty
        6 a busy
        10 a release
        20 - end
    """) == ["0.000 grant a", "10.000 end a released", "10.000 charge a 6.000"]


def test_claimed_idle_is_honoured_for_at_most_a_quarter_of_a_contended_hold() -> None:
    """idle, contended: of the part of a hold in which another slice waited, at most a
    quarter may be claimed idle (a false claim moves no time onto the waiter): 8 ms claimed
    of 10 ms contended, 2.5 honoured."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        1 a idle 8
        10 a release
        20 - end
    """)[:4] == [
        "0.000 grant a",
        "10.000 end a released",
        "10.000 grant b",
        "10.000 charge a 7.500",
    ]


def test_time_since_the_last_look_counts_as_contended_when_a_waiter_is_found() -> None:
    """idle, by looks: the broker classes the time since its last look by what it sees now.
    b asks at 4, 3 ms after the look at 1: 1 ms uncontended, 9 contended; of 8 ms claimed,
    1 + 9/4 = 3.25 honoured."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        1 a idle 8
        4 b want
        10 a release
        20 - end
    """)[:4] == [
        "0.000 grant a",
        "10.000 end a released",
        "10.000 grant b",
        "10.000 charge a 6.750",
    ]


def test_a_lease_renewed_in_the_future_is_not_believed() -> None:
    """future: a time a slice claims that is later than the broker's clock by more than
    1 ms is a lie: a lease 'renewed' at 1 s counts from the grant (lapsed at 50 ms), one
    renewed 0.9 ms ahead is believed."""
    trace = """
        0 a settings share=50 policy=burst
        0 b settings share=50 prio=low policy=burst
        0 a want
        1 b want
        1 a silence
        1 a claim active_ns={}
        80 - end
    """
    assert play(trace.format(1000))[1] == "51.000 end a lease"
    assert play(trace.format(1.9))[1] == "52.000 end a lease"


def test_a_drain_dated_in_the_future_counts_as_nothing_queued() -> None:
    """future, drains: a drain report dated past the broker's clock is not believed; the
    tail is taken as empty (the next holder is charged from the revocation)."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        12 a drain at=500
        16 b release
        30 - end
    """)[3:] == ["12.000 charge a 10.000", "16.000 end b released", "16.000 charge b 6.000"]


def test_a_release_is_dated_at_most_200us_before_the_broker_sees_it() -> None:
    """release slack: a release dates the hold's end, but no earlier than 0.2 ms before the
    broker saw it (or the grant): dated 0.1 ms early it counts, 0.3 ms early it is 'now'."""
    assert play("""
        0 a settings share=50 policy=burst
        0 a want
        5 a release at=4.9
        6 a want
        10 a release at=9.7
        20 - end
    """) == [
        "0.000 grant a",
        "5.000 end a released",
        "5.000 charge a 4.900",
        "6.000 grant a",
        "10.000 end a released",
        "10.000 charge a 4.000",
    ]


def test_a_taken_grant_stays_taken_whatever_the_slice_writes_after() -> None:
    """taken, latched: the broker notes that a process took the grant the first time it sees
    it; a holder that then scrambles owner_seq still has its queued work as a tail of its
    own (had it looked untaken, nothing queued, the next holder would pay it)."""
    assert play("""
        0 a settings share=90 policy=burst
        0 b settings share=10 policy=burst
        0 a want
        0 b want
        5 a claim owner_seq=0
        13 b release
        70 - end
    """)[3:] == [
        "13.000 end b released",
        "60.000 charge a 60.000",
        "60.000 charge b 3.000",
    ]
