/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger.h - a slice's GPU time within one hold, dated by the GPU's clock.
 *
 * libvgpu records timing events in the streams it launches into (sched.c); the
 * holder thread reaps them in the order they were recorded and hands each one
 * here as (the GPU time it completed, the CPU times its record call began and
 * returned, the launches it closes). From those alone the ledger knows when the
 * process's work ended (last_end), how long its kernels run (per_ns) and the CPU
 * time of any GPU time (clock map). No CPU thread's wake-up enters any of it: a
 * holder that looks late sees the same times as one that looks at once.
 *
 * Pure: no clock reads, no driver calls, no syscalls, no atomics, no globals.
 * The rules, each with its trace test (tests/libvgpu/test_ledger_traces.py):
 *
 *   clock map   CPU(g) = g + base. An event cannot complete before it was
 *               recorded, so base >= rec - g for every event; the largest such
 *               value seen within the last two map windows is the map (an event
 *               recorded on an idle stream completes as it is recorded and makes
 *               it exact; the window lets the GPU's and the CPU's clocks drift).
 *   at record   an event that completed within VG_LEDGER_AT_RECORD_NS of its
 *               record call's return found its stream idle (a call slowed by a
 *               lock or a preempted thread is not lateness): the launches it
 *               closes had ended earlier, at an unknown time. They are dated from the last
 *               known end (or the launch that ended a gap, if later) plus their
 *               learnt length, never later than the event.
 *   busy        the GPU time of closed launches: from the later of the last end
 *               and the gap's end to their end.
 *   end         otherwise the event's GPU time is when the launches it closes ended.
 *   length      per_ns is the median of the last VG_LEDGER_SAMPLES samples: the GPU
 *               time between two events that both completed after their recording,
 *               with no empty queue claimed between them (or from the start event
 *               that ended the gap), per launch; and an event that completed as it
 *               was recorded, whose launches ran within the time since the last end,
 *               when that bound is shorter than the length known (kernels shorter
 *               than a launch give no other sample).
 */
#ifndef VG_LEDGER_H
#define VG_LEDGER_H

#include <stdint.h>

/* An event that completed this close to its recording found its stream idle
 * (a driver's submission latency is a few us; simgpu's is zero). */
#define VG_LEDGER_AT_RECORD_NS 20000ull
/* The clock map forgets samples older than two windows of this (clock drift). */
#define VG_LEDGER_MAP_WINDOW_NS 1000000000ull
#define VG_LEDGER_SAMPLES 15

struct vg_ledger {
    int mapped;                 /* a clock map exists */
    int64_t base, base_prev;    /* max(rec - gpu) in this window and the one before */
    uint64_t window_from;       /* CPU time this map window began */
    int have_end;               /* last_end is known */
    int64_t last_end;           /* GPU time the work closed so far had ended */
    int last_exact;             /* the last event completed after its recording */
    int gap_since;              /* an empty queue was claimed since the last event ... */
    int64_t restart;            /* ... and work came again at this GPU time */
    uint64_t per_ns;            /* GPU time per launch; 0 = not known yet */
    uint64_t shortest_ns;       /* ... the shortest of the samples it is the median of */
    uint64_t samples[VG_LEDGER_SAMPLES];
    unsigned nsamples;
    uint64_t busy_ns;           /* GPU time the closed launches took, all holds */
};

void vg_ledger_init(struct vg_ledger *l);

/* An event completed at GPU time gpu (ns, any origin, the same for every event),
 * recorded by a call at CPU times [rec, ret], closing `launches` launches. Events are
 * handed in the order they were recorded. Returns the GPU time the closed launches
 * ended. */
int64_t vg_ledger_event(struct vg_ledger *l, int64_t gpu, uint64_t rec, uint64_t ret, uint64_t launches);

/* Whether an event that completed at CPU time `ran`, recorded by a call that returned
 * at `ret`, completed as it was recorded (rule "at record"). */
int vg_ledger_at_record(uint64_t ran, uint64_t ret);

/* Whether a hold's start event, completed at GPU time gpu and recorded by a call that
 * returned at ret, says its work first ran later than that (a start claim), not at once
 * (a launch claim: the queue was empty and nothing held the GPU back). `waited`: it was
 * not done when first asked right after the record, so it waited for the engine (other
 * contexts' time slices, or older work) whatever the clock map says: while other contexts
 * keep the GPU busy, no event completes at its record and the map stays up to a time
 * slice early, so by the map alone a start behind another context's turn looks at once
 * (rule "Start claim"). */
int vg_ledger_start_late(const struct vg_ledger *l, int64_t gpu, uint64_t ret, int waited);

/* Whether an event that completed at GPU time gpu, recorded at CPU time rec, closing
 * `launches` launches queued behind work that ended at prev (recorded no later than that,
 * by the clock map: else the app may have left a gap), shows that work held back in
 * between: it took
 * longer than its launches run (the shortest kernel length sampled) by more than the
 * at-record margin and an eighth of them (kernels vary). Then another context's turn ran
 * in between, begun no earlier than *held = prev (GPU time: the work ran at least that
 * long; a later guess, the middle of those launches, made a step loop of 500 us kernels pay
 * 0.24 ms of every overlap its neighbour ran). Without a kernel length, no. */
int vg_ledger_held_back(const struct vg_ledger *l, int64_t prev, int64_t gpu, uint64_t rec, uint64_t launches,
                        int64_t *held);

/* The queue was empty and a launch came at CPU time at: the next event's launches
 * ran from then, not back to back with the last ones. */
void vg_ledger_gap(struct vg_ledger *l, uint64_t at);

/* The CPU time of GPU time gpu (the clock map; gpu itself before any map). */
uint64_t vg_ledger_cpu(const struct vg_ledger *l, int64_t gpu);

/* The GPU time of CPU time cpu (the inverse). */
int64_t vg_ledger_gpu(const struct vg_ledger *l, uint64_t cpu);

/* The CPU time the closed launches ended, or `otherwise` when none is known. */
uint64_t vg_ledger_end_cpu(const struct vg_ledger *l, uint64_t otherwise);

#endif
