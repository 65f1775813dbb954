/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vg_slots.h - lock-free per-process accounting in shared memory.
 *
 * A table of slots lives in a file that several processes map. Each process
 * owns one slot and only ever adds to or subtracts from its own counters, so a
 * process killed at any instruction can never leave a lock held; its slot is
 * reclaimed by whoever next notices that its pid is gone (pid + start time, so
 * a recycled pid is not mistaken for the owner). Used by libvgpu (slice regions)
 * and simgpu (the simulated device's memory).
 */
#ifndef VG_SLOTS_H
#define VG_SLOTS_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define VG_SLOT_REAPING 0x80000000u /* pid field while a reaper clears the slot */
#define VG_SLOTS_MAX 1024u            /* the largest table: a high water above it is not believed */

/* 64 bytes; the layout is part of the region file format (vgpu_region.h). */
struct vg_slot {
    _Atomic uint32_t pid;            /* 0 = free, owner pid, or VG_SLOT_REAPING | reaper pid */
    uint32_t flags;
    _Atomic uint64_t start_time;     /* owner's start time, clock ticks since boot */
    _Atomic uint64_t used;           /* device memory charged to this process, bytes */
    _Atomic uint64_t busy_ns;        /* device time consumed by this process */
    _Atomic uint64_t last_active_ns; /* CLOCK_MONOTONIC of the last submission */
    _Atomic uint64_t pid_ns;         /* inode of the owner's pid namespace (0 = unknown) */
    uint64_t reserved[2];
};

/* Start time of pid from /proc (field 22 of stat), 0 when unknown. */
uint64_t vg_proc_start_time(pid_t pid);
/* Inode of the calling process's pid namespace (0 when /proc is unreadable). */
uint64_t vg_pid_ns_self(void);
/* 1 when the slot's owner runs: pid (as seen in pid namespace pid_ns) started at
 * start_time. An owner in another namespace (a container seen from the host) is
 * looked up by namespace and start time in /proc; where that cannot be told (a
 * sibling container's /proc), it counts as alive: never reap what we cannot see. */
int vg_pid_alive(uint32_t pid, uint64_t start_time, uint64_t pid_ns);
/* The slot owner's pid as the caller's namespace numbers it (what NVML reports:
 * host pids for container processes, seen from the host); 0 when gone or unseen. */
uint32_t vg_pid_visible(uint32_t pid, uint64_t start_time, uint64_t pid_ns);

/* Claim the slot of the calling process (reusing its own slot after exec).
 * Returns the slot index, or -1 when the table is full of live processes. */
int vg_slots_claim(struct vg_slot *slots, uint32_t capacity, _Atomic uint32_t *high_water);
/* Reclaim the slots of dead processes; returns how many were freed. */
unsigned vg_slots_reap(struct vg_slot *slots, _Atomic uint32_t *high_water);
/* Sum of `used` over the table (dead processes included until reaped). */
uint64_t vg_slots_used(const struct vg_slot *slots, const _Atomic uint32_t *high_water);
/* Sum of `used` over live processes only (reaps first). */
uint64_t vg_slots_used_live(struct vg_slot *slots, _Atomic uint32_t *high_water);
/* Charge bytes to slot idx if the table's total stays <= limit.
 * Returns 0 on success, -1 (nothing charged) when it would pass the limit. */
int vg_slots_charge(struct vg_slot *slots, _Atomic uint32_t *high_water, int idx, uint64_t bytes,
                    uint64_t limit);
/* As vg_slots_charge, for a table others may write (a tenant's usage file): this
 * process's part of the total is *own, its private tally (reserved first, so threads
 * of one process see each other's charges), whatever slot idx says meanwhile; own
 * NULL is vg_slots_charge. */
int vg_slots_charge_own(struct vg_slot *slots, _Atomic uint32_t *high_water, int idx, uint64_t bytes,
                        uint64_t limit, _Atomic uint64_t *own);
/* Give bytes back from slot idx (never below zero). */
void vg_slots_uncharge(struct vg_slot *slots, int idx, uint64_t bytes);

#endif
