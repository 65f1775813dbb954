/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy.h - the broker's rules: who holds a GPU's token, when a hold ends, and
 * what each slice is charged (vgpu_sched.h; docs/compute.md, "Rules").
 *
 * Pure: no syscalls, no clock reads, no atomics, no globals. `now` is a parameter;
 * the inputs are each slice's settings and this step's snapshot of its claims (its
 * .req); the outputs are a decision (end the hold, grant a slice, when to look
 * again) and the accounting the broker publishes (struct vg_pol_slice, struct
 * vg_pol_summary). broker.c does the I/O around it: it finds and reads the files,
 * keeps the clock, publishes into the GPU file and wakes the slices.
 *
 * Each rule has a named trace test (tests/libvgpu/test_policy_traces.py, through
 * build/tests/policy_trace): a trace of claims in, decisions and charges out, in ms.
 */
#ifndef VG_POLICY_H
#define VG_POLICY_H

#include <stdint.h>

#include "../include/vgpu_timing.h"

#define VG_POL_SLICES 128u                 /* = VGPU_SCHED_ENTRIES */
#define VG_POL_SEG_MAX 8                   /* holds whose GPU time is not settled yet */

#define VG_POL_QUANTUM_NS (10 * VGPU_MS)   /* longest hold while another slice with equal claim waits ... */
#define VG_POL_HOLDS_PER_TAIL 4            /* ... unless its slice's tails are longer than a quarter of it */
#define VG_POL_QUANTUM_MAX_NS VGPU_TAIL_MAX_NS /* ... up to the longest tail the broker waits for */
#define VG_POL_START_CREDIT_NS (2 * VGPU_MS) /* a slice new on the GPU may start at once */
#define VG_POL_MIN_HOLD_NS (2 * VGPU_MS)   /* a fixed slice waits for this much credit: fewer hand-overs */
#define VG_POL_MIN_HOLD_ALONE_NS (1 * VGPU_MS) /* ... or this much while it is the only active slice */
#define VG_POL_CREDIT_CAP_NS (20 * VGPU_MS) /* the most credit an idle slice keeps */
#define VG_POL_CAP_MARGIN_NS (2 * VGPU_MS) /* ... and a waiter this close to it loses credit: it goes next */
#define VG_POL_DEBT_CAP_NS (20 * VGPU_MS)  /* burst: idle time used beyond the share is not owed past this */
#define VG_POL_FIXED_DEBT_CAP_NS (60000 * VGPU_MS) /* fixed: owes what it ran (a launch may run for
                                                     * seconds), bounded so no stall starves it long */
#define VG_POL_CONTENDED_IDLE_DIV 4        /* claimed idle honoured while others wait: a quarter of that time */
#define VG_POL_RELEASE_SLACK_NS (200 * VGPU_US) /* a release is dated at most this long before it is seen */
#define VG_POL_STALE_NS (60000 * VGPU_MS)  /* standalone: a slice silent this long is dropped */

/* A slice's settings: vgpud's .conf (standalone: its own .req). */
struct vg_pol_settings {
    uint32_t share;  /* percent 2..100 */
    uint32_t prio;   /* enum vgpu_priority */
    uint32_t policy; /* enum vgpu_policy */
    uint32_t floor;  /* percent kept while a higher priority runs */
};

/* This step's snapshot of a slice's claims (its .req; all zeros when the file is not
 * whole or not its own). Each is a claim about that slice alone, believed only within
 * the rules. Times in ns, seqs are grant seqs (vgpu_sched_req has the meanings). */
struct vg_pol_claims {
    uint32_t want;        /* processes waiting for the token */
    uint64_t want_ns;     /* ... renewed then */
    uint32_t owner_seq;   /* the grant seq a process took */
    uint32_t release_seq; /* the grant seq given back (queue drained) ... */
    uint64_t release_ns;  /* ... then */
    uint32_t drain_seq;   /* the revoked grant seq whose queued work completed ... */
    uint64_t drain_ns;    /* ... then */
    uint32_t yield_seq;   /* the grant seq offered back (it syncs, CPU work follows) */
    uint64_t idle_ns;     /* GPU-queue-empty time within the hold owner_seq */
    uint64_t active_ns;   /* lease / activity, renewed then */
    uint64_t idle_since;  /* the queue has been empty since (0 = busy) */
    uint32_t start_seq;   /* the grant seq whose work first ran on the GPU ... */
    uint64_t start_ns;    /* ... then (the previous tail and the GPU's context switch before) */
    uint32_t launch_seq;  /* the grant seq whose first launch found the slice's queue empty ... */
    uint64_t launch_ns;   /* ... then: its work ran no earlier (later behind a tail still running) */
    uint32_t turn_seq;    /* the grant seq whose work, first run at start_ns, was first held back ... */
    uint64_t turn_ns;     /* ... then: its first turn on a GPU that time-slices contexts ended */
};

/* One slice: settings and claims in, the broker's accounting of it out. */
struct vg_pol_slice {
    int in_use;
    struct vg_pol_settings set;
    struct vg_pol_claims req;
    int64_t credit;        /* earned at share% of wall time, minus charges */
    int64_t floor_credit;  /* earned at floor%, spent by holds on the floor */
    uint64_t credit_ts;    /* credit earned up to then */
    uint64_t last_active;  /* last request, hold or activity: active within VGPU_ACTIVE_NS */
    uint64_t last_seen;    /* ... present within VGPU_PRESENT_NS */
    uint64_t registered;
    uint64_t used;         /* GPU time charged in total */
    uint32_t holds;        /* grants made to it */
    uint64_t tail_ns;      /* its revoked holds' tails (drain less end), a running average */
    uint32_t late_seq;     /* a hold whose tail was settled unreported ... */
    uint64_t late_from;    /* ... charged until then: a later drain report pays the rest */
    uint64_t late_lost;    /* ... and gets back what the credit cap took meanwhile */
    uint64_t late_began;   /* ... its tail began then (the hold's end) */
    uint64_t late_start;   /* ... its hold was charged from then ... */
    uint64_t late_paid;    /* ... this much in all, when it was settled */
    uint64_t late_ready;   /* ... and its work could not run before then: a late tail ahead
                            * of it in GPU order drained then (0: none known) */
    uint64_t late_back;    /* ... or it ran alongside that tail: half of the overlap, taken
                            * off what its drain report charges */
    uint32_t late_next_seq; /* ... the hold after it, which may have run alongside the tail */
    int late_next;         /* ... (its slice) */
    int late_next_settled; /* ... once settled: */
    uint64_t late_next_first, late_next_end; /* ... its start claim, and its end if it gave
                            * the hold back (0: revoked, its work ran on as a tail) */
    int waiting;           /* it waits for the token (a believed, renewed request) */
};

/* A hold whose GPU time is not settled yet. Holds run on the GPU one after another:
 * each one's work starts when the one before it drained, or, on a GPU that time-slices
 * between contexts, alongside that tail (the two then pay half of the overlap each). */
struct vg_pol_seg {
    int slice;         /* -1: the slice is gone, its time is nobody's */
    uint32_t seq;
    int on_floor, revoked;
    uint64_t granted;
    uint64_t start;    /* when its work could start; 0 = after the segment before it */
    uint64_t end;      /* when the hold ended (released or revoked); 0 = still held */
    uint64_t idle;     /* idle time it claimed (fixed when the hold ends) ... */
    uint64_t idle_cap; /* ... and the most of it, with its start claim, it may deduct */
    uint64_t first;    /* when its work first ran on the GPU, as claimed (0: not known) */
    uint64_t launch;   /* when its first launch found its queue empty, as claimed (0: not known) */
    uint64_t turn;     /* when its first turn on the GPU ended, as claimed (0: not known) */
    uint64_t ovl_first, ovl_fin, ovl_half; /* it ran alongside the tail before it, [first, fin),
                            * and was charged half of that from the tail's end ... */
    int ovl_slice;     /* ... the tail's slice */
    uint64_t penalty;  /* charged on top: a tail never reported */
    uint64_t refund;   /* taken off: half of a late tail before it that it ran alongside */
    int taken;         /* a process of the slice took the grant (latched when first seen) */
    int drained;       /* its slice reported this hold's drain (latched) ... */
    uint64_t drain_claim, drain_seen; /* ... dated this, seen then */
};

struct vg_pol {
    struct vg_pol_slice sl[VG_POL_SLICES];
    uint32_t epoch;    /* the broker's, in each seq's top 4 bits */
    int holder;        /* -1: nobody */
    int on_floor;      /* the current hold was granted on floor credit */
    uint32_t seq;      /* the current (or last) grant's seq */
    uint64_t granted, uncontended, last_step;
    struct vg_pol_seg seg[VG_POL_SEG_MAX];
    int nseg;
    unsigned active;   /* slices active as of the last step */
};

/* Why a hold ended. */
enum vg_pol_end {
    VG_POL_HELD = 0,     /* it did not */
    VG_POL_RELEASED,     /* its slice gave it back, queue drained */
    VG_POL_YIELDED,      /* its slice offered it back and someone waits */
    VG_POL_UNTAKEN,      /* no process took the grant within VGPU_TAKE_NS */
    VG_POL_OUTRANKED,    /* a higher priority became active (granted off the floor) */
    VG_POL_FLOOR_SPENT,  /* granted on floor credit, now spent */
    VG_POL_NO_CREDIT,    /* a fixed slice's credit ran out */
    VG_POL_LEASE,        /* its lease lapsed (VGPU_LEASE_NS) */
    VG_POL_PRIORITY,     /* a waiter of higher priority */
    VG_POL_FLOOR,        /* a waiter due its floor */
    VG_POL_OWES,         /* a better waiter, and the holder has no credit */
    VG_POL_QUANTUM,      /* a better waiter, past the quantum */
    VG_POL_CAP,          /* a better waiter losing credit to the cap */
    VG_POL_TURN,         /* past the quantum, another process of its own slice waits */
    VG_POL_GONE,         /* the slice left */
};

/* What the broker publishes in the GPU file's header (its entries are vg_pol_slice). */
struct vg_pol_summary {
    uint32_t present[3];   /* slices seen within VGPU_PRESENT_NS, per priority */
    uint32_t active_mask;  /* bit p: a slice of priority p active within VGPU_ACTIVE_NS */
    uint32_t contended;    /* a slice other than the holder waits */
    uint32_t active;       /* slices active within VGPU_ACTIVE_NS */
};

/* A step's decision: what to publish, in this order. */
struct vg_pol_decision {
    enum vg_pol_end ended; /* the hold ended (publish grant 0) ... */
    int ended_slice;       /* ... of this slice */
    int revoked;           /* ... taken back (a revocation, for metrics) */
    int granted;           /* a slice was granted the token: publish `word` */
    uint32_t word;         /* (seq << 8) | (slice + 1) */
    struct vg_pol_summary sum;
    uint64_t sleep_ns;     /* look again within this, unless rung */
};

/* A fresh policy for a broker of this epoch: nobody holds, no slice. */
void vg_pol_init(struct vg_pol *p, uint32_t epoch);

/* Set slice i's settings, each clamped to what it may be (share 2..100, ...). */
void vg_pol_settings(struct vg_pol *p, int i, uint32_t share, uint32_t prio, uint32_t policy,
                     uint32_t floor);

/* Take slice i on at now (its settings kept): start credit, no claims. */
void vg_pol_take_on(struct vg_pol *p, int i, uint64_t now);

/* Forget slice i at now: its hold ends, its unsettled holds are nobody's. */
void vg_pol_drop(struct vg_pol *p, int i, uint64_t now, struct vg_pol_decision *d);

/* Standalone: slice i has been silent for VG_POL_STALE_NS and holds nothing, so it
 * may be dropped (its file stays). */
int vg_pol_stale(const struct vg_pol *p, int i, uint64_t now);

/* Standalone: a .req whose claims show no request or activity within
 * VG_POL_STALE_NS is a file left behind, not a slice to take on. */
int vg_pol_left_behind(const struct vg_pol_claims *c, uint64_t now);

/* One step at now over the claims in p->sl[*].req: earn credit, settle holds whose
 * work ended, end the current hold or keep it, grant the next one. */
void vg_pol_step(struct vg_pol *p, uint64_t now, struct vg_pol_decision *d);

/* A short name of why a hold ended ("released", "lease", ...). */
const char *vg_pol_end_name(enum vg_pol_end e);

#endif
