/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_sched.h - compute scheduling between slices that do not trust each other.
 *
 * The slices on one GPU take turns through a token that a trusted broker
 * grants (libvgpu/src/broker.c: the vgpu-broker process that vgpud runs, or,
 * standalone, a thread of one of the slices' processes). Two kinds of file,
 * both in one directory (vgpud: <run_dir>/sched; in a container
 * /run/vgpu/sched; standalone: VGPU_SCHED_DIR):
 *
 *   <GPU uuid>                 struct vgpu_sched: written by the broker only,
 *                              read-only to every slice (mounted read-only).
 *                              It holds the grant word the slices wait on (a
 *                              futex wait only reads) and the broker's
 *                              accounting of each slice, for metrics.
 *   <GPU uuid>.<key>.req       struct vgpu_sched_req: one slice's requests
 *                              and reports, written by that slice's processes
 *                              only (mounted into its container alone). The
 *                              broker reads it with pread (a truncated file
 *                              cannot fault it) and treats every value as a
 *                              claim about that slice alone.
 *   <GPU uuid>.<key>.conf      vgpud's settings of the slice on that GPU
 *                              (text, "share=30 priority=1 policy=0 floor=0"),
 *                              never mounted into a container. Standalone
 *                              there is none and the .req's own settings
 *                              count (cooperative processes of one user).
 *   .broker.lock               who serves which GPU file: a broker holds a
 *                              write lock on the byte at the GPU file's inode
 *                              number (broker.h vg_broker_lock). Never mounted
 *                              into a container: a lock on the GPU file itself
 *                              could be taken by any tenant (flock works on a
 *                              read-only fd).
 *
 * <key> is the slice key in 16 lowercase hex digits (vgpu_region.h slice_key).
 *
 * The broker charges a slice the time it holds the token by the broker's own
 * clock; the slice's claims (when its queued work drained, how much of a hold
 * its GPU queue sat empty) are honoured only within that hold and only while
 * no other slice waited, so a lie can cost or gain a slice time within its own
 * holds, never another slice's. A hold ends when the slice gives the token
 * back (its queue drained), when the broker revokes it (quantum, credit,
 * priority) or when its lease lapses.
 *
 * This layout is a contract: arbiter/files/sched_files.py mirrors it with ctypes and
 * tests/arbiter/files/test_sched_files.py proves that sizes and offsets agree. Any change
 * bumps VGPU_SCHED_VERSION.
 */
#ifndef VGPU_SCHED_H
#define VGPU_SCHED_H

#include <stdatomic.h>
#include <stdint.h>

#include "vgpu_checks.h"

#define VGPU_SCHED_MAGIC 0x44454853u     /* "SHED" little-endian */
#define VGPU_SCHED_REQ_MAGIC 0x51455253u /* "SREQ" */
#define VGPU_SCHED_VERSION 2u
#define VGPU_SCHED_ENTRIES 128u
#define VGPU_SCHED_UUID_LEN 96u
/* Where the hook mounts the GPUs' scheduling files in a container
 * (oci_hook.mounts.CONTAINER_SCHED_DIR). */
#define VGPU_SCHED_CONTAINER_DIR "/run/vgpu/sched"
/* Outside a container: the directory of the GPUs' scheduling files (`vgpu run` sets it;
 * arbiter.defaults.ENV_SCHED_DIR). */
#define VGPU_ENV_SCHED_DIR "VGPU_SCHED_DIR"
/* Beside the GPU files: the brokers' lock (arbiter.files.sched_files.BROKER_LOCK_NAME). */
#define VGPU_BROKER_LOCK_NAME ".broker.lock"

/* The broker's accounting of one slice on this GPU (128 bytes); read-only. */
struct vgpu_sched_entry {
    _Atomic uint64_t key;            /* slice key, 0 = free */
    _Atomic uint32_t share;          /* percent 2..100 */
    _Atomic uint32_t priority;       /* enum vgpu_priority */
    _Atomic uint32_t policy;         /* enum vgpu_policy */
    _Atomic uint32_t floor;          /* percent kept while a higher priority runs */
    _Atomic int64_t credit_ns;       /* credit earned at share% of wall time, minus charges */
    _Atomic uint64_t used_ns;        /* GPU time charged in total */
    _Atomic uint64_t last_active_ns; /* last request, hold or activity report */
    _Atomic uint32_t waiting;        /* 1 while the slice waits for the token */
    _Atomic uint32_t holds;          /* times the slice was granted the token */
    _Atomic uint64_t registered_ns;  /* when the broker took the slice on */
    uint64_t reserved[8];
};

struct vgpu_sched {
    uint32_t magic;                  /* VGPU_SCHED_MAGIC, written last */
    uint32_t version;                /* VGPU_SCHED_VERSION */
    uint32_t size;                   /* sizeof(struct vgpu_sched) */
    uint32_t entry_capacity;         /* VGPU_SCHED_ENTRIES */
    char uuid[VGPU_SCHED_UUID_LEN];  /* the GPU ("GPU-..."), "" = by ordinal */
    _Atomic uint32_t grant;          /* futex word: (seq << 8) | (entry + 1), 0 = nobody */
    _Atomic uint32_t doorbell;       /* futex word the broker sleeps on: 1 = asleep, wake it */
    _Atomic uint64_t grant_ns;       /* when the current grant was made */
    _Atomic uint64_t broker_beat_ns; /* the broker's heartbeat (at least every 10 ms) */
    _Atomic uint32_t broker_pid;     /* the broker's pid (informational) */
    _Atomic uint32_t contended;      /* 1 while a slice other than the holder waits */
    _Atomic uint32_t present[3];     /* slices seen within 1 s, per priority (enum vgpu_priority) */
    _Atomic uint32_t active_mask;    /* bit p: a slice of priority p was active within 5 ms */
    _Atomic uint64_t handoffs;       /* grants made, for metrics */
    _Atomic uint64_t revocations;    /* grants the broker took back, for metrics */
    _Atomic uint32_t active;         /* slices active within 5 ms: a holder keeps a short queue if > 1 */
    _Atomic uint32_t broker_epoch;   /* bumped by each broker that starts; an older one stops */
    _Atomic uint32_t wake_epoch;     /* = broker_epoch while the broker wakes each slice through the
                                      * wake word of its own .req; a slice then waits there, where no
                                      * other slice can wake it (a FUTEX_WAKE needs only a read-only
                                      * mapping, and every container maps this file). Otherwise it
                                      * waits on grant (was reserved: a broker that never sets it is
                                      * waited for on grant, as before) */
    uint32_t pad3;
    uint64_t reserved[10];
    struct vgpu_sched_entry entries[VGPU_SCHED_ENTRIES];
};

/* One slice's requests and reports on one GPU (256 bytes), written by its
 * processes only. Times are CLOCK_MONOTONIC ns; seqs are grant seqs. */
struct vgpu_sched_req {
    uint32_t magic;                  /* VGPU_SCHED_REQ_MAGIC, written last */
    uint32_t version;                /* VGPU_SCHED_VERSION */
    uint32_t size;                   /* sizeof(struct vgpu_sched_req) */
    uint32_t pad;
    uint64_t key;                    /* the slice key (also in the file name) */
    /* Standalone settings (a .conf, where there is one, wins). */
    uint32_t share, priority, policy, floor;
    _Atomic uint32_t want;           /* processes of the slice waiting for the token */
    _Atomic uint32_t owner;          /* pid (own namespace) of the process using the grant */
    _Atomic uint64_t want_ns;        /* waiters renew it: an old one means none is alive */
    _Atomic uint32_t owner_seq;      /* the grant seq the owner took */
    _Atomic uint32_t release_seq;    /* the grant seq given back (its queue drained) */
    _Atomic uint64_t release_ns;     /* when it was given back */
    _Atomic uint32_t drain_seq;      /* the grant seq whose queued work completed */
    _Atomic uint32_t yield_seq;      /* the grant seq it offers back: it syncs, and its queued
                                      * work then runs out with nothing after it for a while
                                      * (was padding: a slice that never writes it yields nothing) */
    _Atomic uint64_t drain_ns;       /* when it completed (after a revocation) */
    _Atomic uint64_t idle_ns;        /* GPU-queue-empty time within the grant owner_seq */
    _Atomic uint64_t active_ns;      /* holders and 100% slices renew it: alive and using the GPU */
    _Atomic uint64_t idle_since;     /* the holder's GPU queue has been empty since (0 = busy) */
    _Atomic uint64_t start_ns;       /* when the hold start_seq's work first ran on the GPU (its
                                      * clock, mapped): what came before, the previous holder's
                                      * tail and the GPU's switch between contexts, is not this
                                      * hold's (was reserved: a slice that never writes it claims
                                      * its first gap in idle_ns as before) */
    _Atomic uint32_t start_seq;      /* the grant seq start_ns belongs to */
    uint32_t pad2;
    _Atomic uint32_t wake;           /* the broker bumps it (pwrite) and wakes its waiters when it
                                      * grants this slice or takes it on; the slice's threads wait on
                                      * it (struct vgpu_sched wake_epoch; was reserved) */
    uint32_t pad3;
    _Atomic uint64_t launch_ns;      /* when the hold launch_seq's first launch found its queue
                                      * empty (its start event completed as it was recorded):
                                      * its work ran no earlier, maybe later, behind the previous
                                      * holder's tail (was reserved: a slice that never writes it
                                      * claims that first gap in idle_ns as before) */
    _Atomic uint32_t launch_seq;     /* the grant seq launch_ns belongs to */
    uint32_t pad4;
    _Atomic uint64_t turn_ns;        /* when the hold turn_seq's work, first run at start_ns, was
                                      * first held back while other work ran (its first time
                                      * slice ended: on a GPU that time-slices contexts, beside a
                                      * revoked tail its first turn runs whole before the tail's
                                      * rest); a claim that only costs its maker (was reserved: a
                                      * slice that never writes it shares such an overlap half
                                      * and half) */
    _Atomic uint32_t turn_seq;       /* the grant seq turn_ns belongs to */
    uint32_t pad5;
    uint64_t reserved[11];
};

/* What a reader checks before it trusts each file, field and value, and what its
 * creator writes there: the one list of these rules (vgpu_checks.h;
 * arbiter/files/header_checks.py keeps it as data). A creator writes the fields of
 * *_FIELDS first and magic last. Which GPU a region is for (uuid) and which slice a
 * .req is (key) are the reader's to check: only it knows what it expects. */
#define VGPU_SCHED_FIELDS(X)                                                           \
    X(version, VGPU_SCHED_VERSION)                                                     \
    X(size, sizeof(struct vgpu_sched))                                                 \
    X(entry_capacity, VGPU_SCHED_ENTRIES)
#define VGPU_SCHED_CHECKS(X) X(magic, VGPU_SCHED_MAGIC) VGPU_SCHED_FIELDS(X)
#define VGPU_SCHED_REQ_FIELDS(X)                                                       \
    X(version, VGPU_SCHED_VERSION)                                                     \
    X(size, sizeof(struct vgpu_sched_req))
#define VGPU_SCHED_REQ_CHECKS(X) X(magic, VGPU_SCHED_REQ_MAGIC) VGPU_SCHED_REQ_FIELDS(X)

VG_DEFINE_CHECK(vgpu_sched_check, struct vgpu_sched, VGPU_SCHED_CHECKS)
VG_DEFINE_CHECK(vgpu_sched_req_check, struct vgpu_sched_req, VGPU_SCHED_REQ_CHECKS)
VG_DEFINE_INIT(vgpu_sched_init, struct vgpu_sched, VGPU_SCHED_FIELDS)
VG_DEFINE_INIT(vgpu_sched_req_init, struct vgpu_sched_req, VGPU_SCHED_REQ_FIELDS)

#endif
