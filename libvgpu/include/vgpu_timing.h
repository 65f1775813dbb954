/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_timing.h - the times the token's two sides rely on each other for: the
 * broker (libvgpu/src/broker.c, its rules in policy.c) and the slices' libvgpu
 * (libvgpu/src/sched.c). Each is defined here once; a value only one side uses
 * stays with it. Times are CLOCK_MONOTONIC nanoseconds.
 *
 * Python mirrors of these values are pinned to this file by
 * tests/project/test_timing_constants.py (a C program prints them as the compiler
 * sees them); docs/compute.md's rules table names them.
 */
#ifndef VGPU_TIMING_H
#define VGPU_TIMING_H

#define VGPU_US 1000ull
#define VGPU_MS 1000000ull

/* The broker. It looks at its slices at least this often, and renews its heartbeat
 * (broker_beat_ns) each time. */
#define VGPU_BEAT_NS (10 * VGPU_MS)
/* A heartbeat older than this: no broker serves the GPU (libvgpu standalone elects
 * another; vgpud reports none, arbiter.files.sched_files.BROKER_DEAD_NS). */
#define VGPU_BROKER_DEAD_NS (50 * VGPU_MS)
/* Standalone: a broker that holds the lock but has not beaten this long (stopped) is
 * replaced even though its process lives. */
#define VGPU_BROKER_STOPPED_NS (500 * VGPU_MS)
/* A time written by the other side that is later than the reader's clock by more than
 * this is a lie, not believed (the broker: a slice's claims; libvgpu: the beat). */
#define VGPU_FUTURE_NS (1 * VGPU_MS)

/* A slice. It is active while it requested, held or reported within this: a request
 * (want_ns) older than it is no longer a waiter; active slices make active_mask,
 * active and the priority rules. */
#define VGPU_ACTIVE_NS (5 * VGPU_MS)
/* Waiters renew their request (want_ns) this often ... */
#define VGPU_WANT_RENEW_NS (1 * VGPU_MS)
/* ... and a 100 % slice that takes no token its activity (active_ns). */
#define VGPU_ACTIVE_RENEW_NS (1 * VGPU_MS)
/* present[] counts the slices seen within this. */
#define VGPU_PRESENT_NS (1000 * VGPU_MS)

/* A hold. A grant none of the slice's processes takes (owner_seq) within this is taken
 * back: a request that was a lie, or a waiter gone. */
#define VGPU_TAKE_NS (5 * VGPU_MS)
/* Its holder renews its lease (active_ns) this often ... */
#define VGPU_LEASE_RENEW_NS (1 * VGPU_MS)
/* ... and loses the token when the lease is this old (its processes died or stopped). */
#define VGPU_LEASE_NS (50 * VGPU_MS)
/* A revoked hold's queued work is its slice's until the slice reports it drained; the
 * broker waits this long for that report, and charges this much when it never comes. */
#define VGPU_TAIL_MAX_NS (50 * VGPU_MS)
/* libvgpu never queues launches longer than this together (one at a time when a launch
 * is longer than half of it): a revoked hold's tail fits in VGPU_TAIL_MAX_NS. */
#define VGPU_TAIL_QUEUE_NS (40 * VGPU_MS)

_Static_assert(VGPU_WANT_RENEW_NS < VGPU_ACTIVE_NS, "a renewing waiter must stay a waiter");
_Static_assert(VGPU_ACTIVE_RENEW_NS < VGPU_ACTIVE_NS, "a renewing 100 % slice must stay active");
_Static_assert(VGPU_LEASE_RENEW_NS < VGPU_LEASE_NS, "a live holder must keep its lease");
_Static_assert(VGPU_BEAT_NS < VGPU_BROKER_DEAD_NS && VGPU_BROKER_DEAD_NS < VGPU_BROKER_STOPPED_NS,
               "a beating broker is alive");
_Static_assert(VGPU_TAIL_QUEUE_NS < VGPU_TAIL_MAX_NS, "a queued tail drains before it is charged in full");

#endif
