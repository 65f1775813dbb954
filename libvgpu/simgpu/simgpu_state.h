/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_state.h - the shared state file that stands for the physical GPUs.
 *
 * Every process that maps the same SIMGPU_STATE file sees the same devices,
 * the same used memory (per-process slots, reclaimed by pid liveness) and one
 * execution engine per device: a timeline on which kernels from all processes
 * run one at a time in submission order.
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../common/vg_slots.h"

#define SIMGPU_MAGIC 0x47504d53u /* "SMPG" */
#define SIMGPU_VERSION 2u
#define SIMGPU_MAX_DEVICES 16u
#define SIMGPU_SLOTS 256u
#define SIMGPU_RING 32768u   /* recent kernel intervals per device: the engine's timeline (a
                              * time-sliced engine writes one per slice: ~32 s of 1 ms slices) */
#define SIMGPU_UTIL_SCAN 4096u /* ... the newest of them NVML's utilisation looks at */
#define SIMGPU_ENTRIES 4096u /* timed engine: work queued per device, all processes */
#define SIMGPU_QUEUES 256u   /* timed engine: queues (streams, or contexts) per device */
#define SIMGPU_NIL 0xffffffffu

struct simgpu_interval {
    _Atomic uint64_t start_ns; /* CLOCK_MONOTONIC */
    _Atomic uint64_t end_ns;
    _Atomic uint32_t pid;
    uint32_t pad;
};

struct simgpu_device {
    uint64_t total_bytes;
    char uuid[48];             /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    uint8_t uuid_bytes[16];
    char name[64];
    uint32_t pci_bus;
    uint32_t minor;
    _Atomic uint64_t tail_ns;      /* when the last submitted kernel finishes */
    _Atomic uint64_t busy_total_ns;/* all kernel time ever submitted */
    _Atomic uint64_t ring_head;    /* next interval to write (mod SIMGPU_RING) */
    struct simgpu_interval ring[SIMGPU_RING];
    _Atomic uint32_t slot_high_water;
    /* 1: the device fell off the bus: NVML calls on it return NVML_ERROR_GPU_IS_LOST.
     * Tests flip it at run time (simgpuDeviceSetLost, build/tests/simgpu_ctl). */
    _Atomic uint32_t lost;
    struct vg_slot slots[SIMGPU_SLOTS];
};

/* How the engines run, decided by the process that creates the state file. */
struct simgpu_config {
    uint32_t timed;      /* 1: the timed engine (engine.c); 0: the FIFO below */
    uint32_t concurrent; /* SIMGPU_CONCURRENT_STREAMS: a queue per stream, not per context */
    uint64_t slice_ns;   /* SIMGPU_TIMESLICE_US: round robin among contexts; 0: FIFO among them */
    uint64_t switch_ns;  /* SIMGPU_SWITCH_US: what the engine loses passing to another context */
};

/* ---- the timed engine (engine.c) ----
 * A kernel's end depends on what other processes submit later, so work is queued and the
 * engine is simulated forward, up to the present, by whichever process looks next.
 * Everything below is under the robust lock: a process killed while holding it leaves a
 * committed cursor behind, and the next locker repairs the entries from it. */
struct simgpu_entry {      /* a kernel, or a wait for another queue's work */
    _Atomic uint32_t state;  /* SIMGPU_E_FREE, _QUEUED, _DONE (kept for an event: refs > 0) */
    uint32_t refs;           /* events of its owner that want its end */
    uint32_t next;           /* the next entry of its queue, up to the queue's tail */
    uint32_t pid;            /* its owner */
    uint32_t ctx;            /* its owner's slot (its context) */
    uint32_t dep_q;          /* a wait: for queue dep_q ... (a kernel: SIMGPU_NIL) */
    uint64_t dep_seq;        /* ... to have done its entry dep_seq */
    _Atomic uint64_t seq;    /* submission number, engine-wide; changes when it is reused */
    uint64_t dur_ns;         /* a kernel's length; 0: a wait */
    _Atomic uint64_t done_ns;/* when it ended on the engine */
};

struct simgpu_queue {      /* in order: a stream's work, or a context's */
    uint32_t used;           /* 0: free; 1: open; 2: its stream is gone (freed once empty) */
    uint32_t ctx;            /* its owner's slot: contexts take turns on the engine */
    uint32_t pid;
    uint32_t head, tail;     /* entries, SIMGPU_NIL when empty */
    uint32_t pad;
    uint64_t piece;          /* ring number of the head's run in progress, UINT64_MAX: none */
    uint64_t rem_ns;         /* what the head kernel has left to run */
    uint64_t done_seq;       /* every entry of this queue numbered up to this is done */
};

struct simgpu_cursor {
    uint64_t t;              /* simulated up to here */
    uint64_t seq;            /* the last submission number */
    uint64_t ring_head;      /* intervals written */
    uint64_t phase_end;      /* SWITCH: when it is over; RUN: when the slice is */
    int32_t owner;           /* the context on the engine (slot), -1: none */
    int32_t last;            /* the context that ran last (another one costs a switch) */
    uint32_t phase;          /* SIMGPU_P_IDLE, _SWITCH, _RUN */
    uint32_t nq;             /* queues in use lie below this */
    uint32_t hint;           /* where to look for a free entry */
    uint32_t pad;
    struct simgpu_queue q[SIMGPU_QUEUES];
};

struct simgpu_engine {
    pthread_mutex_t lock;    /* process-shared, robust */
    _Atomic uint32_t cur;    /* the committed cursor: c[cur] */
    _Atomic uint32_t repairs;/* times a locker found the last owner dead (for tests) */
    _Atomic uint64_t horizon;/* no queued entry ends before this (a lock-free NOT_READY) */
    struct simgpu_cursor c[2];
    struct simgpu_entry e[SIMGPU_ENTRIES];
};

struct simgpu_state {
    uint32_t magic;    /* written last by the creator */
    uint32_t version;
    uint32_t size;     /* sizeof(struct simgpu_state) */
    uint32_t ndev;
    uint64_t created_ns;
    struct simgpu_config cfg;
    struct simgpu_device dev[SIMGPU_MAX_DEVICES];
    struct simgpu_engine eng[SIMGPU_MAX_DEVICES];
};

/* Map the state file (SIMGPU_STATE, default /dev/shm/simgpu-<uid>.state),
 * creating it from SIMGPU_DEVICES when absent. Returns NULL and prints one
 * line on stderr on failure. Thread-safe; the mapping lives for the process. */
struct simgpu_state *simgpu_state(void);

/* CLOCK_MONOTONIC in ns. */
uint64_t simgpu_now_ns(void);

/* The calling process's slot on dev (its context on the engine), -1 when none is free. */
int simgpu_slot(unsigned dev);
/* Charge/uncharge device memory for the calling process. 0 or -1 (out of memory). */
int simgpu_mem_charge(unsigned dev, uint64_t bytes);
void simgpu_mem_uncharge(unsigned dev, uint64_t bytes);
/* Live used memory of a device (reaps dead processes). */
uint64_t simgpu_mem_used(unsigned dev);

/* FIFO engine: put a kernel of dur_ns on device dev's engine after everything queued;
 * returns its end time. Records the interval for utilisation queries. */
uint64_t simgpu_engine_submit(unsigned dev, uint64_t dur_ns);

/* ---- the timed engine (engine.c), when simgpu_state()->cfg.timed ---- */
/* Where some work ends: a queue's entry, numbered seq; t_ns once known (0: not yet). */
struct simgpu_ticket {
    uint64_t t_ns;
    uint64_t seq;
    uint32_t q, idx;
};
/* Open a queue for the calling process on dev: 0, or -1 when all are in use. */
int simgpu_queue_open(unsigned dev, uint32_t *q);
/* Its stream is gone: the queue is freed once its work is done. */
void simgpu_queue_close(unsigned dev, uint32_t q);
/* Queue a kernel of dur_ns on q (dep NULL), or, with dur_ns 0, a wait for dep's work;
 * *out names it. 0, or -1 (out of queue space for good: the queue is unknown). */
int simgpu_queue_submit(unsigned dev, uint32_t q, uint64_t dur_ns, const struct simgpu_ticket *dep,
                        struct simgpu_ticket *out);
/* An event recorded after last (seq 0: nothing submitted): *ev completes with it, or
 * now when that is done (ev->t_ns set); a pending ev holds last's entry for its time. */
void simgpu_ticket_mark(unsigned dev, const struct simgpu_ticket *last, struct simgpu_ticket *ev);
/* 1 when another context than queue q's has work queued on dev (a record on q's idle
 * stream then waits for q's context to get the engine: a zero-length entry). */
int simgpu_engine_others_queued(unsigned dev, uint32_t q);
/* A marked event is done: its time in t->t_ns, its hold given back. 1, or 0 while pending. */
int simgpu_ticket_resolve(unsigned dev, struct simgpu_ticket *t);
/* Give back a pending event's hold (re-recorded or destroyed). */
void simgpu_ticket_release(unsigned dev, struct simgpu_ticket *t);
/* 1 when all n tickets' work is done by now (*end_ns: when the last ended, 0 when that is
 * no longer known: long ago), 0 when not. */
int simgpu_tickets_done(unsigned dev, const struct simgpu_ticket *t, unsigned n, uint64_t *end_ns);
/* The tails of the calling process's queues on dev (what a context sync waits for), at
 * most max; returns how many. */
unsigned simgpu_process_tails(unsigned dev, struct simgpu_ticket *t, unsigned max);
/* Bring the engine up to now (utilisation queries), waiting at most a few ms for the
 * lock: a process stopped inside it must not stall NVML. */
void simgpu_engine_touch(unsigned dev);

/* How a sync waits: sleeps (a CU_EVENT_BLOCKING_SYNC event), busy-waits (any other
 * event, as the driver does), or sleeps and yields to return within a few us of its time
 * (a stream or context sync: the driver's default, CU_CTX_SCHED_AUTO, spins or yields). */
enum simgpu_how { SIMGPU_SLEEP, SIMGPU_SPIN, SIMGPU_YIELD };
/* Wait as how until t_ns, no wake-up latency (the timed engine's waits on the way). */
void simgpu_wait_raw(uint64_t t_ns, enum simgpu_how how);
/* Wait as a sync called at called_ns for work that ends at t_ns: at once when it had
 * ended by then, else to t_ns plus a drawn wake-up latency (SIMGPU_WAKE_US). */
void simgpu_wait_for(uint64_t t_ns, uint64_t called_ns, enum simgpu_how how);
/* Wait until all n tickets' work is done, as a sync called at called_ns. */
void simgpu_tickets_wait(unsigned dev, struct simgpu_ticket *t, unsigned n, uint64_t called_ns,
                         enum simgpu_how how);
/* 0, or -1 after one line on stderr when SIMGPU_WAKE_US is malformed (cuInit refuses). */
int simgpu_wake_check(void);

#endif
