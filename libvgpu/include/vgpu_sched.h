/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_sched.h - the per-GPU scheduling region: one file per physical GPU.
 *
 * The slices on one GPU coordinate compute through it. The arbiter creates
 * <run_dir>/sched/<GPU uuid> for every GPU (the hook mounts the files of a
 * container's GPUs at /run/vgpu/sched/<GPU uuid>); standalone, libvgpu
 * creates <VGPU_SCHED_DIR>/<GPU uuid> itself.
 *
 * The GPU is lent to one process at a time through a token (a futex word):
 * its holder submits, every other throttled process waits. Each slice on the
 * GPU has an entry with its compute budget; a holder is charged the wall time
 * from taking the token (or from the moment the previous holder's queued work
 * completed, drain_ns, if later) until its own last launch completed, so the
 * charge is exactly the GPU time the engine gave it (no sampling), and the
 * next holder can queue work while the last one's finishes: no idle hand-over. Which
 * waiter gets the token next: higher priority first, then a slice with
 * budget, then the least used per share. All fields are written with atomics;
 * a process killed at any instruction leaves no lock: the token carries a
 * lease its holder renews, and a lapsed lease frees it.
 *
 * This layout is a contract: arbiter/sched.py mirrors it with ctypes and
 * tests/test_sched_layout.py proves that sizes and offsets agree. Any change
 * bumps VGPU_SCHED_VERSION.
 */
#ifndef VGPU_SCHED_H
#define VGPU_SCHED_H

#include <stdatomic.h>
#include <stdint.h>

#define VGPU_SCHED_MAGIC 0x44454853u /* "SHED" little-endian */
#define VGPU_SCHED_VERSION 1u
#define VGPU_SCHED_ENTRIES 128u
#define VGPU_SCHED_UUID_LEN 96u

/* One slice on this GPU (128 bytes). */
struct vgpu_sched_entry {
    _Atomic uint64_t key;            /* slice identity (its region file), 0 = free */
    _Atomic uint32_t share;          /* percent 2..100, copied from the slice region */
    _Atomic uint32_t priority;       /* enum vgpu_priority */
    _Atomic uint32_t policy;         /* enum vgpu_policy */
    _Atomic uint32_t floor;          /* percent kept while a higher priority runs */
    _Atomic int64_t budget_ns;       /* credit earned at share% of wall time, minus charges */
    _Atomic uint64_t budget_ts;      /* CLOCK_MONOTONIC up to which budget_ns was earned */
    _Atomic int64_t floor_budget_ns; /* the same at floor%, spent while preempted */
    _Atomic uint64_t used_ns;        /* GPU time charged in total */
    _Atomic uint64_t last_active_ns; /* last launch, hold or wait of any of its processes */
    _Atomic uint32_t waiting;        /* processes of this slice waiting for the token */
    _Atomic uint32_t holds;          /* times this slice took the token */
    _Atomic uint64_t wait_heartbeat_ns; /* waiters renew it; an old one means none */
    uint64_t reserved[6];
};

struct vgpu_sched {
    uint32_t magic;                  /* VGPU_SCHED_MAGIC, written last */
    uint32_t version;                /* VGPU_SCHED_VERSION */
    uint32_t size;                   /* sizeof(struct vgpu_sched) */
    uint32_t entry_capacity;         /* VGPU_SCHED_ENTRIES */
    char uuid[VGPU_SCHED_UUID_LEN];  /* the GPU ("GPU-..."), "" = by ordinal */
    _Atomic uint32_t token;          /* futex word: 0 free, else (token_seq << 8) | (holder entry + 1) */
    _Atomic uint32_t token_entry;    /* holder's entry index + 1, 0 = none */
    _Atomic uint64_t token_since_ns; /* when the holder took it */
    _Atomic uint64_t token_lease_ns; /* past this the holder is presumed dead and the token free */
    _Atomic uint32_t token_pid;      /* holder's pid in its own namespace (informational) */
    _Atomic uint32_t token_seq;      /* bumped on every take; makes token values unique */
    _Atomic uint64_t prio_active_ns[3]; /* last activity per priority (enum vgpu_priority) */
    _Atomic uint64_t handoffs;       /* times the token was taken, for metrics */
    _Atomic uint32_t drain_token;    /* a former holder's token value while its queued work runs */
    uint32_t pad;
    _Atomic uint64_t drain_ns;       /* when the last former holder's work completed */
    _Atomic uint32_t prio_mask;      /* bit p: a slice of priority p has used this GPU (never cleared) */
    uint32_t pad2;
    uint64_t reserved[13];
    struct vgpu_sched_entry entries[VGPU_SCHED_ENTRIES];
};

#endif
