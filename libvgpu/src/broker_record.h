/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_record.h - the broker's inputs, written down so a run can be played again.
 *
 * With VGPU_BROKER_RECORD=DIR a broker appends to DIR/<GPU uuid>.rec every input its
 * pure policy (policy.h) is given: a slice taken on or dropped, a slice's settings and
 * claims when they differ from what the policy held after the step before, and each
 * step's time. The policy is deterministic, so build/tests/policy_replay plays the
 * record through policy.c again and prints every grant, end and charge the broker made
 * (docs/compute.md, "Recording a run"). That is how a run on simgpu or a real GPU
 * becomes a trace test.
 *
 * One line per input, times as the broker's CLOCK_MONOTONIC ns:
 *   broker EPOCH               vg_pol_init: a broker starts (a standalone GPU's next
 *                              elected one appends to the same record)
 *   take NOW I                 vg_pol_take_on
 *   drop NOW I                 vg_pol_drop
 *   set I SHARE PRIO POLICY FLOOR
 *   req I WANT WANT_NS OWNER_SEQ RELEASE_SEQ RELEASE_NS DRAIN_SEQ DRAIN_NS YIELD_SEQ
 *         IDLE_NS ACTIVE_NS IDLE_SINCE START_SEQ START_NS LAUNCH_SEQ LAUNCH_NS TURN_SEQ TURN_NS
 *   step NOW                   vg_pol_step
 */
#ifndef VG_BROKER_RECORD_H
#define VG_BROKER_RECORD_H

#include <stdint.h>

#include "policy.h"

#define VG_RECORD_ENV "VGPU_BROKER_RECORD"

struct vg_record;

/* A record for GPU uuid, by a broker of this epoch, in the directory VGPU_BROKER_RECORD
 * names; NULL when it is not set (or the file cannot be opened: one line on stderr, the
 * broker goes on). */
struct vg_record *vg_record_open(const char *uuid, uint32_t epoch);

void vg_record_take_on(struct vg_record *r, uint64_t now, int i);
void vg_record_drop(struct vg_record *r, uint64_t now, int i);

/* Before vg_pol_step(p, now): the settings and claims that changed, then the step. */
void vg_record_step(struct vg_record *r, const struct vg_pol *p, uint64_t now);

/* After it: what the policy now holds is what the next step's changes are against. */
void vg_record_stepped(struct vg_record *r, const struct vg_pol *p);

#endif
