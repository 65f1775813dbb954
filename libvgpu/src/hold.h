/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hold.h - when a holder whose queue ran empty gives the token back, and when an
 * app's empty spell was a gap it left (sched.c; docs/compute.md, "Rules").
 *
 * Pure: no syscalls, no clock reads, no atomics, no globals. sched.c reads its state
 * (with atomics) into a struct vg_hold_view and acts on what these functions say; each
 * rule has a named trace test (tests/libvgpu/test_hold_traces.py, through
 * build/tests/hold_trace). Times are CPU times in ns.
 *
 *   gap         An app's gap in its work begins when its work ended on the GPU (the
 *               ledger's clock map dates that), or when an app thread last learnt its
 *               work was done, if later: a blocking sync's return, or a query that said
 *               ready after one that said not ready (a polling loop). Waking up to a
 *               sync and a poller that the host kept off its CPU are the host's latency,
 *               not the app's CPU work.
 *   wait        While an app thread waits for its work (inside a blocking sync, or
 *               polling: its last query said not ready), a contended hold is kept up to
 *               VG_HOLD_IDLE_NS after the work ended: the gap has not begun.
 *   give back   Otherwise the hold is given back once the gap reaches VG_HOLD_GAP_NS
 *               while another slice waits (a step loop's sync gap is shorter, its CPU
 *               work longer), or VG_HOLD_IDLE_NS while none does.
 *   long gap    A gap longer than VG_HOLD_GAP_NS, measured up to when an app thread next
 *               wanted to launch, marks a step loop: its next sync offers the hold back.
 */
#ifndef VG_HOLD_H
#define VG_HOLD_H

#include <stdint.h>

#define VG_HOLD_IDLE_NS 2000000ull  /* uncontended: an empty queue keeps the token this long */
#define VG_HOLD_GAP_NS 250000ull    /* contended: ... this long (a step loop's sync gap, not its CPU work) */
#define VG_HOLD_POLL_NS 20000ull    /* an empty queue is looked at again after this */

/* What the holder thread knows of an empty queue and the app's waits. */
struct vg_hold_view {
    uint64_t idle_from;   /* the work ended then (the GPU's clock, mapped), or the hold began */
    uint64_t last_launch; /* the app's last launch */
    uint64_t back;        /* an app thread last learnt its work was done (0: never) */
    int waiting;          /* app threads inside a blocking sync or polling */
    int contended;        /* another slice waits for the token */
};

/* When the app's gap that began at t (its work's end) began for it. */
uint64_t vg_hold_gap_from(uint64_t t, uint64_t back);

/* An empty queue at now: 1 to give the hold back; else 0, and *look_ns says when to
 * look again. */
int vg_hold_give_back(const struct vg_hold_view *v, uint64_t now, uint64_t *look_ns);

/* The app's queue sat empty from `from` (its work's end) until it wanted to launch at
 * `to`: 1 if that was a long gap (a step loop's CPU work), not a sync's. */
int vg_hold_long_gap(uint64_t from, uint64_t to, uint64_t back);

#endif
