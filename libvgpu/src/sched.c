/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sched.c - compute shares and priority: the slice's side of the token
 * (DESIGN.md "Compute between tenants"; vgpu_sched.h; broker.c decides).
 *
 * A throttled slice submits work only while the broker has granted it its
 * GPU's token. This process asks by writing into its slice's own .req file
 * and waits on the grant word of the GPU's file, which it can only read.
 * While it holds the token it records a timing event per EVENT_EVERY_NS of
 * launched work (`every`; not one per launch: a launch costs two atomic adds),
 * one before a launch on an empty queue, and one when the app waits for a
 * stream or its context; the events' GPU times (ledger.h) say when its work
 * ran, so the time its queue sat empty within the hold, which it reports, is
 * measured by the GPU's clock and not by when a CPU thread woke up. It gives
 * the token back as soon as the queue drains while another slice waits (or
 * after VG_HOLD_IDLE_NS when none does: hold.h): the broker then charges GPU busy time,
 * not hold time.
 *
 * Everything read from a mapping is checked before use: the grant's entry
 * index against the table, the entry's key against ours. A GPU file that is
 * missing or not whole fails closed (launches return an error, one line
 * says why); standalone, the slices elect one of their processes to run the
 * broker (whoever holds the file's lock, vg_broker_lock), and a process alone runs one for
 * itself on anonymous memory.
 *
 * Threads: application threads wait in vg_sched_admit; one thread per
 * process (started on the first hold) reaps events, reports and gives back.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../include/vgpu_sched.h"
#include "../include/vgpu_timing.h"
#include "broker.h"
#include "hold.h"
#include "ledger.h"
#include "vgpu_internal.h"

#define US 1000ull
#define MS 1000000ull
#define QUEUE_NS (4 * MS)          /* queued work a holder keeps ahead of the GPU */
#define QUEUE_CONTENDED_NS (1 * MS)/* ... while another slice waits: its wait is our queue */
#define EVENT_EVERY_NS (100 * US)   /* one event per this much launched work */
/* A holder thread blocked this long in one event sync has its lease renewed for it (lease_thread):
 * within VGPU_ACTIVE_NS, so a holder in a long kernel stays active as well as alive. */
#define LEASE_SYNC_NS (2 * MS)
_Static_assert(LEASE_SYNC_NS + VGPU_LEASE_RENEW_NS < VGPU_ACTIVE_NS, "a holder in a long sync stays active");
#define REF_MOVE_NS (50 * MS)      /* the reference event moves on after this much GPU time
                                    * (cuEventElapsedTime is a float of ms: ~3 ns at 50 ms) */
/* What the broker relies on us for (renewals, the tail we may queue) and we on it (its
 * beat) is in vgpu_timing.h (VGPU_*). */
#define PEND_MAX 256u
#define FREE_MAX 64u

enum { ST_UNSET = 0, ST_ON = 1, ST_OFF = -1, ST_REFUSED = -2 };

struct ev {
    CUevent ev;
    CUcontext ctx;
    unsigned launches; /* launches this event closes (0: a start, recorded before a launch
                        * on an empty queue: it dates the work's return on the GPU's clock) */
    uint64_t serial;   /* events are numbered in the order they were recorded */
    uint64_t recorded; /* when (CLOCK_MONOTONIC, read just before the record) ... */
    uint64_t returned; /* ... and the record call returned (a lock or a preemption between
                        * the two is not the event's lateness) */
    int waited;        /* a hold's first start, not done when asked right after its record */
};

struct sdev {
    int state;                   /* enum above */
    struct vgpu_sched *s;        /* the GPU's file: read-only where the arbiter made it */
    struct vgpu_sched_req *q;    /* this slice's requests (ours to write) */
    struct vgpu_region *r;
    uint64_t key;
    int entry;                   /* our entry in s, -1 until the broker lists us */
    int lock_fd;                 /* standalone: held while this process runs the broker */
    int brokering;               /* standalone: a thread of this process serves this GPU */
    uint64_t unbeaten_since;     /* standalone: first seen a locked broker that never beat */
    char path[400];              /* the GPU file (standalone: for the election) */
    /* under g_lock; holding, launching, launches, done, ev_mark, npend, idle_from and
     * depth_now are also read (and launching, launches changed) with atomics by the
     * launch fast path, which takes no lock while the token is held and the queue has room.
     * Cache lines by writer: what every launch writes, what it reads and others seldom
     * write, and what the holder thread writes as it reaps (a line written by the other
     * thread costs the launch a miss: measured +~100 ns per throttled launch, shared). */
    _Alignas(64) uint64_t launches; /* launches admitted; launches - done are queued */
    unsigned launching;
    _Alignas(64) int holding, acquiring, draining;
    int sync_gap;                /* an app's sync returned since our last launch on an empty queue */
    int syncs_in;                /* app threads inside a blocking sync (atomics) ... */
    uint64_t polled;             /* ... a query found the work running, 1 + launches then
                                  * (0: none since one found it done): while no launch
                                  * came after it, the app polls ... */
    uint64_t sync_back;          /* ... and when the last one returned or found the work done:
                                  * an app's gap in its work begins then (hold.h, "gap") */
    unsigned depth_now;          /* launches we may have queued now (depth()) */
    unsigned every;
    uint32_t grant, seq;
    uint64_t ev_mark;            /* launches when the last event was recorded */
    CUstream ev_stream;
    unsigned npend;
    _Alignas(64) uint64_t done;  /* launches closed by reaped events: they have completed */
    uint64_t seen_launches, empty_since; /* launches after the last event, seen then: one look
                                  * later with none added, an event closes them */
    uint32_t drain_seq;
    uint64_t ev_serial, drain_serial;  /* a revoked hold drains when its last event (this) completes */
    uint64_t last_launch, idle_from, idle_total, last_active, last_beat;
    uint64_t sync_from;          /* the holder thread has blocked in an event sync since (0: not) */
    uint64_t hold_from;          /* when this process took the current hold */
    uint64_t first_gap;          /* the hold's first gap, claimed idle at its first launch ... */
    uint64_t first_start;        /* ... until the start event before it (this serial) says when
                                  * the work first ran: then that goes to the broker instead */
    int turn_watch;              /* after a start claim: the first time the work is held back
                                  * (another context's turn) goes to the broker (turn_ns) ... */
    int64_t turn_prev;           /* ... the GPU time the work before the next event ended */
    uint64_t gave_from;          /* our queue ran empty then and the hold ended (0: none since) */
    uint64_t asked_from;         /* an app thread first wanted to launch, holding nothing, then */
    int long_gaps;               /* our queue's last empty spell outlasted VG_HOLD_GAP_NS (a step loop's
                                  * CPU work after its sync): the next sync offers the token back */
    uint32_t yielded;            /* the seq we offered back */
    /* What our work did on the GPU, by the GPU's clock (ledger.h): times of reaped events
     * are cuEventElapsedTime from a reference event of ours, whose own GPU time is ref_gpu. */
    struct vg_ledger led;
    int have_ref;
    struct ev ref;
    int64_t ref_gpu;
    uint64_t busy_noted;         /* led.busy_ns already added to the region's busy time */
    struct ev pend[PEND_MAX];
    struct ev freel[FREE_MAX];
    unsigned nfree;
};

static struct sdev g_dev[VG_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;        /* app threads (init_conds) */
static pthread_cond_t g_thread_cond; /* the holder's thread */
static int g_thread_started;
static pthread_cond_t g_lease_cond;  /* the lease thread, asleep while no holder thread syncs */
static int g_lease_asleep;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static volatile int g_broker_stop;   /* never set: a broker thread lives as long as its process */

/* Driver entry points we call but do not hook. */
static CUresult (*p_event_create)(CUevent *, unsigned);
static CUresult (*p_event_record)(CUevent, CUstream);
static CUresult (*p_event_query)(CUevent);
static CUresult (*p_event_sync)(CUevent);
static CUresult (*p_event_destroy)(CUevent);
static CUresult (*p_ctx_current)(CUcontext *);
static CUresult (*p_elapsed)(float *, CUevent, CUevent);
static CUresult (*p_capture_mode)(CUstreamCaptureMode *); /* optional (CUDA >= 10.1) */

static int take_event(struct sdev *d, struct ev *out);
static unsigned every(const struct sdev *d);
static unsigned depth(const struct sdev *d, int contended);

/* The kernel's tick-granular clock: a few ns, for the 100% path's stamps. */
static uint64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct timespec deadline_in(uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ns;
    while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* ---- what the GPU file says, checked ---- */

/* Our entry, looked up again when the one we knew no longer names us. */
static int my_entry(struct sdev *d)
{
    int i = d->entry;
    if (i >= 0 && i < (int)VGPU_SCHED_ENTRIES && atomic_load(&d->s->entries[i].key) == d->key)
        return i;
    d->entry = -1;
    for (unsigned k = 0; k < VGPU_SCHED_ENTRIES; k++)
        if (atomic_load(&d->s->entries[k].key) == d->key)
            return d->entry = (int)k;
    return -1;
}

/* Whether grant word g is a grant to our slice. */
static int grant_is_ours(struct sdev *d, uint32_t g)
{
    uint32_t idx = (g & 0xFFu);
    if (!g || idx == 0 || idx > VGPU_SCHED_ENTRIES)
        return 0;
    return atomic_load(&d->s->entries[idx - 1].key) == d->key;
}

static int broker_alive(const struct sdev *d, uint64_t now)
{
    uint64_t beat = atomic_load(&d->s->broker_beat_ns);
    return beat && beat <= now + VGPU_FUTURE_NS && now - beat < VGPU_BROKER_DEAD_NS;
}

/* ---- standalone: run the broker here when nobody does ---- */

static void start_detached(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals are not ours */
    pthread_create(&t, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

struct broker_job {
    struct vg_bgpu *g;
    int *running; /* cleared when the broker stops (replaced): this process may run one again */
};

static void *broker_thread(void *arg)
{
    struct broker_job *job = arg;
    prctl(PR_SET_NAME, "vgpu-broker");
    vg_bgpu_run(job->g, &g_broker_stop);
    if (job->running)
        __atomic_store_n(job->running, 0, __ATOMIC_RELEASE);
    return NULL;
}

static void start_broker(struct vg_bgpu *g, int *running)
{
    static struct broker_job jobs[VG_MAX_DEVICES + 1];
    static int njobs;
    if (njobs >= (int)(sizeof(jobs) / sizeof(jobs[0])))
        return; /* (a process replaces brokers this often only in a pathological test) */
    struct broker_job *job = &jobs[njobs++];
    job->g = g;
    job->running = running;
    if (running)
        __atomic_store_n(running, 1, __ATOMIC_RELEASE);
    start_detached(broker_thread, job);
}


/* Become the GPU's broker if its file's lock is free (its holder died), or if the
 * broker has been silent so long that its process must be stopped: a new broker
 * bumps the epoch, and the old one stops serving when it runs again. */
static void try_elect(struct sdev *d)
{
    if (vg_cfg.sched_from_arbiter || !d->path[0] || __atomic_load_n(&d->brokering, __ATOMIC_ACQUIRE))
        return;
    if (d->lock_fd < 0) {
        int fd = open(d->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
            return;
        int lock = vg_broker_lock(fd, d->path);
        int held = lock < 0 && errno == EAGAIN;
        close(fd);
        if (lock >= 0) {
            d->lock_fd = lock;
        } else {
            if (!held)
                return; /* no lock can be had here at all: never two brokers */
            /* Another process holds the lock: take over only from a broker that has been
             * silent (or never beat: one starting now beats within a step) this long. */
            uint64_t beat = atomic_load(&d->s->broker_beat_ns), now = vg_broker_now();
            if (!beat && !d->unbeaten_since)
                d->unbeaten_since = now;
            if (beat ? now > beat && now - beat < VGPU_BROKER_STOPPED_NS
                     : now - d->unbeaten_since < VGPU_BROKER_STOPPED_NS)
                return;
        }
    }
    const char *why = "";
    struct vg_bgpu *g = vg_bgpu_open(d->path, 0, &why);
    if (!g)
        return;
    start_broker(g, &d->brokering);
}

/* ---- per-device setup ---- */

static void fill_sched(void *map, void *uuid)
{
    struct vgpu_sched *s = map;
    vgpu_sched_init(s); /* the checked fields (vgpu_sched.h) */
    snprintf(s->uuid, sizeof(s->uuid), "%s", (const char *)uuid);
    atomic_store((_Atomic uint32_t *)&s->magic, VGPU_SCHED_MAGIC);
}

static void fill_req(void *map, void *keyp)
{
    struct vgpu_sched_req *q = map;
    vgpu_sched_req_init(q); /* the checked fields (vgpu_sched.h) */
    q->key = *(uint64_t *)keyp;
    q->share = 100;
    q->priority = VGPU_PRIORITY_NORMAL;
    atomic_store((_Atomic uint32_t *)&q->magic, VGPU_SCHED_REQ_MAGIC);
}

static void *map_file(const char *path, size_t size, int writable, int create, void (*fill)(void *, void *),
                      void *arg, const char **why)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            struct stat sb;
            void *m = MAP_FAILED;
            if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size >= size)
                m = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
            close(fd);
            if (m != MAP_FAILED)
                return m;
            *why = "not a whole file of this vgpu version";
            return NULL;
        }
        if (errno != ENOENT || !create) {
            *why = errno == ENOENT ? "missing" : strerror(errno);
            return NULL;
        }
        /* Standalone: every process of the user may need to write it. */
        void *m = vg_create_linked(path, size, 0666, 1, fill, arg);
        if (m)
            return m;
        if (errno != EEXIST) {
            *why = strerror(errno);
            return NULL;
        }
    }
    *why = "could not be created";
    return NULL;
}

static void *anon(size_t size)
{
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* Copy the slice's own settings into its request (read by a standalone broker). */
static void post_settings(struct sdev *d)
{
    struct vgpu_sched_req *q = d->q;
    q->share = atomic_load(&d->r->compute_share);
    q->priority = atomic_load(&d->r->priority);
    q->policy = atomic_load(&d->r->policy);
    q->floor = atomic_load(&d->r->priority_floor);
}

static int setup_files(struct sdev *d, const char *name, const char *uuid)
{
    const char *why = "";
    char req[480];
    int arbiter = vg_cfg.sched_from_arbiter;
    snprintf(d->path, sizeof(d->path), "%s/%s", vg_cfg.sched_dir, name);
    snprintf(req, sizeof(req), "%s.%016llx.req", d->path, (unsigned long long)d->key);
    d->s = map_file(d->path, sizeof(struct vgpu_sched), !arbiter, !arbiter, fill_sched, (void *)uuid, &why);
    if (d->s && (!vg_sched_header_ok(d->s) || (uuid[0] && strcmp(d->s->uuid, uuid) != 0))) {
        munmap(d->s, sizeof(struct vgpu_sched));
        d->s = NULL;
        why = "not a vgpu scheduling region of this version for this GPU";
    }
    if (!d->s) {
        fprintf(stderr, "vgpu: %s: %s; kernel launches on this GPU are refused\n", d->path, why);
        return -1;
    }
    d->q = map_file(req, sizeof(struct vgpu_sched_req), 1, !arbiter, fill_req, &d->key, &why);
    uint64_t got, want;
    if (d->q && (vgpu_sched_req_check(d->q, &got, &want) || d->q->key != d->key)) {
        munmap(d->q, sizeof(struct vgpu_sched_req));
        d->q = NULL;
        why = "not this slice's request file";
    }
    if (!d->q) {
        fprintf(stderr, "vgpu: %s: %s; kernel launches on this GPU are refused\n", req, why);
        return -1;
    }
    post_settings(d);
    if (!broker_alive(d, vg_broker_now()))
        try_elect(d);
    return 0;
}

static int setup_private(struct sdev *d, const char *uuid)
{
    d->s = anon(sizeof(struct vgpu_sched));
    d->q = anon(sizeof(struct vgpu_sched_req));
    if (!d->s || !d->q)
        return -1;
    fill_sched(d->s, (void *)uuid);
    fill_req(d->q, &d->key);
    post_settings(d);
    struct vg_bgpu *g = vg_bgpu_private(d->s, d->q, d->key);
    if (!g)
        return -1;
    start_broker(g, NULL);
    return 0;
}

/* Timed waits on the monotonic clock: a wall-clock jump must not stall hand-overs. */
static void init_conds(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &attr);
    pthread_cond_init(&g_thread_cond, &attr);
    pthread_cond_init(&g_lease_cond, &attr);
    pthread_condattr_destroy(&attr);
}

static void after_fork_child(void)
{
    /* The child holds no token, runs no thread and no broker; its events are the parent's. */
    pthread_mutex_init(&g_lock, NULL);
    init_conds();
    g_thread_started = 0;
    g_lease_asleep = 0;
    for (int i = 0; i < VG_MAX_DEVICES; i++) {
        struct sdev *d = &g_dev[i];
        d->holding = d->acquiring = d->draining = 0;
        d->sync_from = 0;
        d->launching = d->npend = d->nfree = 0;
        d->launches = d->done = d->ev_mark = 0;
        d->have_ref = 0; /* (the parent's events) */
        vg_ledger_init(&d->led);
        d->busy_noted = 0;
        if (d->lock_fd >= 0)
            close(d->lock_fd); /* the parent keeps the lock; we must not outlive it holding it */
        d->lock_fd = -1;
        d->brokering = 0;
        if (d->state == ST_ON && !d->path[0])
            d->state = ST_OFF; /* a private broker ran in the parent: there is none here */
    }
}

static void register_atfork(void)
{
    init_conds(); /* before any thread waits on them */
    pthread_atfork(NULL, NULL, after_fork_child);
}

static int look_up_driver(void)
{
    p_event_create = (CUresult(*)(CUevent *, unsigned))vg_driver_sym("cuEventCreate");
    p_event_record = (CUresult(*)(CUevent, CUstream))vg_driver_sym("cuEventRecord");
    p_event_query = (CUresult(*)(CUevent))vg_driver_sym("cuEventQuery");
    p_event_sync = (CUresult(*)(CUevent))vg_driver_sym("cuEventSynchronize");
    p_event_destroy = (CUresult(*)(CUevent))vg_driver_sym("cuEventDestroy_v2");
    p_ctx_current = (CUresult(*)(CUcontext *))vg_driver_sym("cuCtxGetCurrent");
    p_elapsed = (CUresult(*)(float *, CUevent, CUevent))vg_driver_sym("cuEventElapsedTime");
    p_capture_mode = (CUresult(*)(CUstreamCaptureMode *))vg_driver_sym("cuThreadExchangeStreamCaptureMode");
    return p_event_create && p_event_record && p_event_query && p_event_sync && p_event_destroy && p_ctx_current &&
           p_elapsed;
}

/* Set device dev up once (under g_lock). */
static void sdev_init(struct sdev *d, int dev)
{
    d->state = ST_OFF;
    d->lock_fd = -1;
    d->entry = -1;
    d->every = 1;
    struct vgpu_region *r = vg_region(dev);
    if (!r || !look_up_driver())
        return;
    pthread_once(&g_atfork_once, register_atfork);
    d->r = r;
    d->key = atomic_load(&r->slice_key); /* never 0: the region was checked when it was opened */
    char name[VGPU_REGION_UUID_LEN + 8];
    if (r->uuid[0])
        snprintf(name, sizeof(name), "%.*s", (int)VGPU_REGION_UUID_LEN - 1, r->uuid);
    else
        snprintf(name, sizeof(name), "gpu%d", dev);
    int rc = vg_cfg.sched_dir[0] ? setup_files(d, name, r->uuid) : setup_private(d, r->uuid);
    d->state = rc == 0 ? ST_ON : vg_cfg.sched_dir[0] ? ST_REFUSED : ST_OFF;
}

static struct sdev *sdev_get(int dev, int *refused)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return NULL;
    struct sdev *d = &g_dev[dev];
    int st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (VG_UNLIKELY(st == ST_UNSET)) {
        pthread_mutex_lock(&g_lock);
        if (d->state == ST_UNSET) {
            sdev_init(d, dev);
            __atomic_store_n(&d->state, d->state, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&g_lock);
        st = d->state;
    }
    *refused = st == ST_REFUSED;
    return st == ST_ON ? d : NULL;
}

/* ---- the holder's side ---- */

/* The GPU time event e completed, on this device's timeline: cuEventElapsedTime from our
 * reference event; 1 when e is to become the reference. The reference moves on every
 * REF_MOVE_NS so the float keeps its precision. A first reference, one of another context
 * (a timeline of its own) or one the driver will not compare with e starts the timeline
 * anew at e, dated as if it completed when it was recorded (a start event, the first of
 * all, did). */
static int gpu_time(struct sdev *d, const struct ev *e, int64_t *out)
{
    float ms = 0;
    if (d->have_ref && d->ref.ctx == e->ctx && p_elapsed(&ms, d->ref.ev, e->ev) == CUDA_SUCCESS) {
        *out = d->ref_gpu + (int64_t)((double)ms * 1e6);
        return ms * 1e6 >= (double)REF_MOVE_NS || ms * 1e6 <= -(double)REF_MOVE_NS;
    }
    if (d->have_ref)
        p_event_destroy(d->ref.ev);
    d->have_ref = 0;
    *out = vg_ledger_gpu(&d->led, e->recorded);
    return 1;
}

static void free_event(struct sdev *d, const struct ev *e)
{
    if (d->nfree < FREE_MAX)
        d->freel[d->nfree++] = *e;
    else
        p_event_destroy(e->ev);
}

/* The hold's first start event, recorded by a call that returned at `ret`, completed at
 * CPU time `ran`. Our claim of the first gap, from the grant to the launch, goes (idle_ns
 * first: a broker that reads in between overcharges us for a step, never our
 * neighbours): only the broker knows where our hold's span begins, at the grant or when
 * the previous holder's queued work ended, and a gap claimed from the grant deducted from
 * us again a tail that the previous holder pays (a fixed 10 % beside a fixed 90 % got
 * 10.3 %). Instead:
 *   - it ran after it was recorded: the GPU got to our work only then, after the previous
 *     tail or the GPU's switch to our context (~150 us on an H200): start_ns;
 *   - it completed as it was recorded: our queue was empty and our work ran no earlier
 *     than the launch, later if the GPU was still busy with another context's tail (an
 *     event on an idle stream does not wait for it): launch_ns.
 * Nor is the first launch's call claimed idle, unlike a later launch that ends an empty
 * spell (vg_sched_done): behind a tail the GPU was busy then, and the call's time (~20 us
 * here, more on a slower host or a preempted thread) was deducted from every such hold
 * of a fixed 10 % beside a fixed 90 %; on an idle GPU it is the few us until the driver
 * has the kernel. */
static void claim_start(struct sdev *d, const struct ev *e, int64_t gpu)
{
    uint64_t gap = d->first_gap - 1, ran = vg_ledger_cpu(&d->led, gpu);
    d->first_start = 0;
    if (!d->holding)
        return;
    d->idle_total -= gap < d->idle_total ? gap : d->idle_total;
    atomic_store(&d->q->idle_ns, d->idle_total);
    if (vg_ledger_start_late(&d->led, gpu, e->returned, e->waited)) {
        atomic_store(&d->q->start_ns, ran);
        atomic_store(&d->q->start_seq, d->seq);
        d->turn_watch = 1;
        d->turn_prev = gpu;
    } else {
        atomic_store(&d->q->launch_ns, ran);
        atomic_store(&d->q->launch_seq, d->seq);
    }
}

/* After a start claim, the first event that shows our work held back while it was queued:
 * on a GPU that time-slices contexts, our first turn ended no earlier than the work before
 * it (vg_ledger_held_back) and a revoked tail that we ran alongside had the rest (turn_ns:
 * the broker gives that tail's owner back what of the overlap was ours beyond half; a
 * claim that only costs us). Only within the hold: the broker reads it when the hold ends. */
static void watch_turn(struct sdev *d, const struct ev *e, int64_t gpu)
{
    int64_t held;
    if (!d->holding) {
        d->turn_watch = 0;
    } else if (!e->launches) {
        d->turn_prev = gpu; /* a start after a gap: the work came again then */
    } else if (vg_ledger_held_back(&d->led, d->turn_prev, gpu, e->recorded, e->launches, &held)) {
        atomic_store(&d->q->turn_ns, vg_ledger_cpu(&d->led, held));
        atomic_store(&d->q->turn_seq, d->seq);
        d->turn_watch = 0;
    } else if (gpu > d->turn_prev) {
        d->turn_prev = gpu;
    }
}

/* Completed events, in the order they were recorded, go to the ledger and back to the
 * free list (or become the reference). In order: a later event of another stream that
 * completed first waits for the earlier one, so the ledger sees ends in GPU order. */
static void reap(struct sdev *d)
{
    unsigned i = 0;
    for (; i < d->npend; i++) {
        struct ev *e = &d->pend[i];
        CUresult rc = p_event_query(e->ev);
        if (rc == CUDA_ERROR_NOT_READY)
            break;
        __atomic_add_fetch(&d->done, e->launches, __ATOMIC_SEQ_CST);
        if (rc != CUDA_SUCCESS)
            continue; /* its context is gone, and the event with it */
        int64_t gpu = 0;
        int ref = gpu_time(d, e, &gpu);
        vg_ledger_event(&d->led, gpu, e->recorded, e->returned, e->launches);
        if (d->turn_watch)
            watch_turn(d, e, gpu);
        if (e->serial == d->first_start)
            claim_start(d, e, gpu);
        if (ref == 1) {
            if (d->have_ref)
                free_event(d, &d->ref);
            d->ref = *e;
            d->ref_gpu = gpu;
            d->have_ref = 1;
        } else {
            free_event(d, e);
        }
    }
    memmove(d->pend, d->pend + i, (d->npend - i) * sizeof(d->pend[0]));
    __atomic_store_n(&d->npend, d->npend - i, __ATOMIC_SEQ_CST);
    if (d->led.busy_ns > d->busy_noted) {
        vg_note_busy((int)(d - g_dev), d->led.busy_ns - d->busy_noted, vg_broker_now());
        d->busy_noted = d->led.busy_ns;
    }
}

/* Our own event calls on an app thread while a capture is open in the process: relaxed
 * capture mode around them, so they never invalidate a global-mode capture of another
 * thread (PyTorch captures CUDA graphs that way). Returns whether to restore `old`. */
static int relax(CUstreamCaptureMode *old)
{
    if (!p_capture_mode || !atomic_load_explicit(&vg_captures_open, memory_order_relaxed))
        return 0;
    *old = CU_STREAM_CAPTURE_MODE_RELAXED;
    return p_capture_mode(old) == CUDA_SUCCESS;
}

static void unrelax(int relaxed, CUstreamCaptureMode old)
{
    if (relaxed)
        p_capture_mode(&old);
}

enum { CLOSE = 0, START = 1, START_FIRST = 2 }; /* what record() records: a hold's first start
                                                * also asks whether it waits */

static int record_event(struct sdev *d, CUstream stream, int start);

/* Record an event in stream: a close after the launches so far, or a start before a
 * launch on an empty queue. */
static int record(struct sdev *d, CUstream stream, int start)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    int rc = record_event(d, stream, start);
    unrelax(relaxed, old);
    return rc;
}

static int record_event(struct sdev *d, CUstream stream, int start)
{
    struct ev ev;
    uint64_t n = __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST);
    if (d->npend >= PEND_MAX || (!start && n <= d->ev_mark) || take_event(d, &ev) != 0)
        return -1;
    ev.launches = start ? 0 : (unsigned)(n - d->ev_mark);
    ev.serial = ++d->ev_serial;
    ev.recorded = vg_broker_now();
    if (p_event_record(ev.ev, stream) != CUDA_SUCCESS) {
        p_event_destroy(ev.ev); /* e.g. a stream of another context: the hold still covers it */
        return -1;
    }
    ev.returned = vg_broker_now();
    /* A hold's first start: does it wait for the engine? (vg_ledger_start_late; one query
     * per hold, in the record's relaxed capture mode) */
    ev.waited = start == START_FIRST && p_event_query(ev.ev) == CUDA_ERROR_NOT_READY;
    d->pend[d->npend] = ev;
    if (!start) {
        __atomic_store_n(&d->ev_mark, n, __ATOMIC_SEQ_CST);
        d->ev_stream = stream;
        d->every = every(d);
    }
    __atomic_store_n(&d->npend, d->npend + 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* Close the launches after the last event (none pending): a holder or a sync that finds
 * them must learn when they end. If no event can be recorded (their stream is gone),
 * they are done now, their time unknown. */
static void close_uncovered(struct sdev *d)
{
    if (record(d, d->ev_stream, CLOSE) == 0)
        return;
    uint64_t n = __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST), mark = d->ev_mark;
    if (n <= mark)
        return;
    __atomic_store_n(&d->ev_mark, n, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&d->done, n - mark, __ATOMIC_SEQ_CST);
}

static void report_drained(struct sdev *d, uint64_t now)
{
    d->gave_from = now;
    atomic_store(&d->q->drain_ns, now);
    atomic_store(&d->q->drain_seq, d->drain_seq);
    d->draining = 0;
    vg_broker_ring(d->s);
}

/* Give the token back; the time our queue sat empty in this hold is not ours to pay. */
static void give_back(struct sdev *d, uint64_t now)
{
    /* The empty spell we are in stays claimed (idle_since) up to whenever the broker ends
     * the hold: a broker that sees the release late must not charge the wait as ours. */
    if (!d->idle_from)
        atomic_store(&d->q->idle_since, 0);
    atomic_store(&d->q->idle_ns, d->idle_total);
    atomic_store(&d->q->release_ns, now);
    atomic_store(&d->q->release_seq, d->seq);
    __atomic_store_n(&d->holding, 0, __ATOMIC_SEQ_CST);
    d->gave_from = d->idle_from ? d->idle_from : now;
    d->idle_from = 0;
    vg_broker_ring(d->s);
    pthread_cond_broadcast(&g_cond);
}

/* An app thread polls for its work: a query found it running and no launch came since
 * (hold.h, "wait"). */
static int polls(const struct sdev *d)
{
    uint64_t p = __atomic_load_n(&d->polled, __ATOMIC_SEQ_CST);
    return p && p - 1 == __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST);
}

/* When an app's last wait for its work ended (hold.h, "gap"). */
static uint64_t sync_back(const struct sdev *d)
{
    return __atomic_load_n(&d->sync_back, __ATOMIC_SEQ_CST);
}

/* Queued launches kept ahead of the GPU: about QUEUE_NS of work, less while other
 * slices use the GPU (what we queue is what they wait for once they ask). */
static unsigned depth(const struct sdev *d, int contended)
{
    uint64_t q = contended ? QUEUE_CONTENDED_NS : QUEUE_NS;
    /* A launch of unknown length may be as long as any (a 1 s kernel): one at a time until
     * the ledger has a length (the first launch's events give one as it completes), or the
     * first hold of a slice of long kernels queues several and its tail, charged to it,
     * outlasts the broker's wait many times over. */
    if (!d->led.per_ns)
        return 1;
    uint64_t n = q / d->led.per_ns;
    /* Long launches (a big graph): one at a time once two would make a revoked hold's
     * tail longer than the broker waits for a drain report (VGPU_TAIL_MAX_NS). */
    if (d->led.per_ns > VGPU_TAIL_QUEUE_NS / 2)
        return 1;
    return n < 2 ? 2 : n > 100000 ? 100000 : (unsigned)n;
}

/* Launches per event: about EVENT_EVERY_NS of work. */
static unsigned every(const struct sdev *d)
{
    if (!d->led.per_ns)
        return 1;
    uint64_t n = EVENT_EVERY_NS / d->led.per_ns;
    return n < 1 ? 1 : n > 64 ? 64 : (unsigned)n;
}

static void *holder_thread(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "vgpu-holder");  /* what `top -H` shows an operator */
    prctl(PR_SET_TIMERSLACK, 1UL); /* hand-overs wait on this thread's sleeps */
    /* Our event queries and syncs must never invalidate an app thread's global-mode
     * stream capture (PyTorch's default for CUDA graphs): relaxed, for this thread. */
    if (p_capture_mode) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        p_capture_mode(&mode);
    }
    pthread_mutex_lock(&g_lock);
    for (;;) {
        int busy = 0;
        uint64_t wait_ns = 0;
        for (int dev = 0; dev < VG_MAX_DEVICES; dev++) {
            struct sdev *d = &g_dev[dev];
            if (d->state != ST_ON || !(d->holding || d->draining))
                continue;
            busy = 1;
            reap(d);
            uint64_t now = vg_broker_now();
            if (d->holding && atomic_load(&d->s->grant) != d->grant &&
                !__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST)) {
                /* Revoked: what we queued still runs, and is ours until it ends. An event
                 * now, while it runs, dates that end on the GPU's clock. */
                __atomic_store_n(&d->holding, 0, __ATOMIC_SEQ_CST);
                d->draining = 1;
                d->drain_seq = d->seq;
                if (__atomic_load_n(&d->launches, __ATOMIC_SEQ_CST) > d->ev_mark)
                    close_uncovered(d);
                d->drain_serial = d->ev_serial;
                pthread_cond_broadcast(&g_cond);
            }
            unsigned depth_now = depth(d, atomic_load(&d->s->contended) || atomic_load(&d->s->active) > 1);
            if (depth_now != d->depth_now)
                d->depth_now = depth_now; /* (written only when it changes: launches read its line) */
            if (d->npend && !__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST)) {
                /* Block on our oldest event: a launch waiting for room goes in the moment
                 * one completes. (When we wake does not date anything: the event does.) */
                CUevent first = d->pend[0].ev;
                d->sync_from = now; /* a long one: the lease thread renews our lease meanwhile */
                if (g_lease_asleep) {
                    g_lease_asleep = 0;
                    pthread_cond_signal(&g_lease_cond);
                }
                pthread_mutex_unlock(&g_lock);
                p_event_sync(first);
                pthread_mutex_lock(&g_lock);
                d->sync_from = 0;
                reap(d);
                now = vg_broker_now();
            }
            if (d->holding && now - d->last_beat >= VGPU_LEASE_RENEW_NS) {
                d->last_beat = now; /* the lease: a holder that stops renewing it loses the token */
                atomic_store(&d->q->active_ns, now);
            }
            if (d->draining && (!d->npend || d->pend[0].serial > d->drain_serial))
                report_drained(d, vg_ledger_end_cpu(&d->led, now));
            if (!d->holding)
                continue;
            if (d->npend) {
                d->empty_since = 0;
                continue;
            }
            /* Launches after the last event, or an empty queue: either way, act only once a
             * look finds no launch added since the one before (a launch loop faster than
             * its kernels empties its queue between launches: not a gap to claim, and a
             * claim costs the next launch the lock). What acting dates, the GPU's clock
             * dates: the wait only decides whether a gap is long enough to bother. */
            uint64_t n = __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST);
            if (!d->idle_from && (!d->empty_since || n != d->seen_launches)) {
                d->empty_since = now;
                d->seen_launches = n;
                wait_ns = VG_HOLD_POLL_NS;
                continue;
            }
            if (!d->idle_from && now - d->empty_since < VG_HOLD_POLL_NS) {
                wait_ns = VG_HOLD_POLL_NS - (now - d->empty_since);
                continue;
            }
            if (n > __atomic_load_n(&d->done, __ATOMIC_SEQ_CST)) {
                /* Launches after the last event, none pending: an event closes them
                 * (recorded while they run, it dates their end; after, the ledger does). */
                if (!__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST))
                    close_uncovered(d);
                d->empty_since = 0;
                continue;
            }
            if (!d->idle_from) {
                /* Every launch closed by an event: the queue has been empty since our work
                 * ended on the GPU (or the hold began). Claim it, then look again for a launch
                 * that passed the fast path meanwhile (it checks idle_from after counting
                 * itself in launching). */
                uint64_t from = vg_ledger_end_cpu(&d->led, d->hold_from);
                if (from < d->hold_from)
                    from = d->hold_from;
                if (from > now)
                    from = now;
                __atomic_store_n(&d->idle_from, from, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST) ||
                    __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST) != n) {
                    d->idle_from = 0;
                    continue;
                }
                atomic_store(&d->q->idle_since, from);
            }
            if (__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST))
                continue;
            struct vg_hold_view v = {
                .idle_from = d->idle_from,
                .last_launch = d->last_launch,
                .back = sync_back(d),
                .waiting = __atomic_load_n(&d->syncs_in, __ATOMIC_SEQ_CST) || polls(d),
                .contended = atomic_load(&d->s->contended) != 0,
            };
            uint64_t look_ns;
            if (vg_hold_give_back(&v, now, &look_ns))
                give_back(d, now);
            else
                wait_ns = look_ns;
        }
        pthread_cond_broadcast(&g_cond);
        if (!busy) {
            pthread_cond_wait(&g_thread_cond, &g_lock);
            continue;
        }
        /* An empty queue: wake for a launch, a revocation or a waiter (contended). */
        uint64_t t = wait_ns ? (wait_ns < 100 * US ? wait_ns : 100 * US) : 50 * US;
        struct timespec ts = deadline_in(t);
        pthread_cond_timedwait(&g_thread_cond, &g_lock, &ts);
    }
    return NULL;
}

/* The holder thread renews its lease between event syncs; one sync can outlast the lease
 * (a kernel longer than VGPU_LEASE_NS, or one that other contexts' time slices stretch), and
 * a live holder must not lose the token as if its process had died. This thread renews the
 * lease of a holder thread blocked in a sync longer than LEASE_SYNC_NS, while its grant
 * stands. It stops with its process (death, SIGSTOP), so the lease still says that; a hung
 * kernel keeps a hold only until its credit or quantum runs out, as any other. */
static void *lease_thread(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "vgpu-lease");
    pthread_mutex_lock(&g_lock);
    for (;;) {
        uint64_t now = vg_broker_now(), next = 0;
        for (int dev = 0; dev < VG_MAX_DEVICES; dev++) {
            struct sdev *d = &g_dev[dev];
            if (d->state != ST_ON || !d->holding || !d->sync_from)
                continue;
            uint64_t due = (d->last_beat > d->sync_from ? d->last_beat : d->sync_from) + LEASE_SYNC_NS;
            if (now >= due && atomic_load(&d->s->grant) == d->grant) {
                d->last_beat = now;
                atomic_store(&d->q->active_ns, now);
                due = now + LEASE_SYNC_NS;
            }
            if (!next || due < next)
                next = due;
        }
        if (!next) {
            g_lease_asleep = 1; /* the next sync wakes us */
            pthread_cond_wait(&g_lease_cond, &g_lock);
            continue;
        }
        struct timespec ts = deadline_in(next > now ? next - now : 0);
        pthread_cond_timedwait(&g_lease_cond, &g_lock, &ts);
    }
    return NULL;
}

static void start_thread(void)
{
    if (g_thread_started)
        return;
    g_thread_started = 1;
    start_detached(holder_thread, NULL);
    start_detached(lease_thread, NULL);
}

/* The word this slice's threads sleep on while they wait for the broker: the wake word of
 * its own .req while the broker serving the GPU bumps it (no other slice maps that file,
 * so none can wake us: a FUTEX_WAKE needs only a read-only mapping, and every slice maps
 * the GPU file); else, from an older broker, the grant word. The value to compare is
 * read before what the caller checks, so a wake in between is not lost. */
static _Atomic uint32_t *wait_word(struct sdev *d)
{
    uint32_t e = atomic_load(&d->s->wake_epoch);
    return e && e == atomic_load(&d->s->broker_epoch) ? &d->q->wake : &d->s->grant;
}

/* Wait (without g_lock) until the broker grants our slice the token and this
 * process takes it for the slice. */
static void acquire(struct sdev *d, uint32_t *grant_out)
{
    struct vgpu_sched *s = d->s;
    struct vgpu_sched_req *q = d->q;
    uint64_t now = vg_broker_now(), renewed = now;
    post_settings(d);
    atomic_store(&q->want_ns, now);
    atomic_fetch_add(&q->want, 1);
    vg_broker_ring(s);
    for (;;) {
        _Atomic uint32_t *word = wait_word(d);
        uint32_t w = atomic_load(word);
        uint32_t g = atomic_load(&s->grant);
        if (grant_is_ours(d, g)) {
            uint32_t seq = g >> 8, cur = atomic_load(&q->owner_seq);
            /* A new hold claims no idle time yet (zeroed before it is ours: the broker
             * believes idle_ns only for the seq in owner_seq). */
            if (cur != seq) {
                atomic_store(&q->idle_ns, 0);
                atomic_store(&q->idle_since, 0);
                atomic_store(&q->start_seq, 0);
                atomic_store(&q->launch_seq, 0);
                atomic_store(&q->turn_seq, 0);
            }
            if (cur != seq && atomic_compare_exchange_strong(&q->owner_seq, &cur, seq)) {
                vg_broker_ring(s); /* taken: the broker notes it now (a grant nobody takes is taken back) */
                *grant_out = g;
                break;
            }
        }
        vg_futex_wait(word, w, VGPU_WANT_RENEW_NS);
        now = vg_broker_now();
        if (now - renewed >= VGPU_WANT_RENEW_NS) {
            renewed = now;
            post_settings(d);
            atomic_store(&q->want_ns, now);
            if (!atomic_load(&q->want))
                atomic_store(&q->want, 1); /* rewritten under us: ask again */
            vg_broker_ring(s);
            if (!broker_alive(d, now))
                try_elect(d);
        }
    }
    if (atomic_fetch_sub(&q->want, 1) == 1)
        atomic_store(&q->want_ns, 0); /* nobody of this slice waits any more */
}

static int device_of(void)
{
    /* One device is the common case: no driver call for it. */
    return vg_region_count() == 1 ? 0 : vg_current_device();
}

/* The broker lists a slice within a few ms of its first request; whether it
 * needs the token at all (full_share) is read from that entry. */
static void await_entry(struct sdev *d)
{
    uint64_t since = vg_broker_now();
    int said = 0;
    for (;;) {
        _Atomic uint32_t *word = wait_word(d);
        uint32_t w = atomic_load(word);
        if (my_entry(d) >= 0)
            break;
        atomic_store(&d->q->want_ns, vg_broker_now());
        vg_broker_ring(d->s);
        uint64_t now = vg_broker_now();
        if (!broker_alive(d, now))
            try_elect(d);
        if (!said && now - since > 2000 * MS) {
            fprintf(stderr, "vgpu: %s: no broker serves this slice yet; waiting\n", d->path);
            said = 1;
        }
        vg_futex_wait(word, w, MS);
    }
}

/* A 100% slice needs no token while nobody else at or above its priority is on
 * the GPU (the broker's count); it reports activity so lower ones yield. */
static int full_share(struct sdev *d)
{
    int i = my_entry(d);
    if (i < 0 || atomic_load(&d->s->entries[i].share) < 100)
        return 0;
    uint32_t p = atomic_load(&d->s->entries[i].priority);
    if (p > VGPU_PRIORITY_HIGH)
        return 0;
    for (uint32_t h = p + 1; h <= VGPU_PRIORITY_HIGH; h++)
        if (atomic_load(&d->s->present[h]))
            return 0;
    if (atomic_load(&d->s->present[p]) > 1)
        return 0; /* (0: the broker lists us and has not counted yet) */
    uint64_t now = coarse_ns();
    if (now - d->last_active >= VGPU_ACTIVE_RENEW_NS) {
        d->last_active = now;
        atomic_store(&d->q->active_ns, vg_broker_now());
    }
    return 1;
}

/* The launch path while we hold the token with room in the queue: two atomic adds,
 * no lock. The holder thread may be giving the token back at this very moment: we
 * count ourselves in `launching` first, then look again (it looks at `launching`
 * after claiming the queue empty, so one of us sees the other). */
/* Launches queued: admitted and not known to have completed. */
static unsigned queued_of(const struct sdev *d)
{
    uint64_t n = __atomic_load_n(&d->launches, __ATOMIC_RELAXED), c = __atomic_load_n(&d->done, __ATOMIC_RELAXED);
    return n > c ? (unsigned)(n - c < UINT32_MAX ? n - c : UINT32_MAX) : 0;
}

/* An empty queue takes the lock only after a sync returned (the gap from its work's end
 * to this launch is claimed there): a launch loop faster than its kernels finds the queue
 * empty at most launches, and the holder's look claims any gap longer than a poll. */
static int admit_fast(struct sdev *d)
{
    unsigned queued = queued_of(d);
    if (!__atomic_load_n(&d->holding, __ATOMIC_SEQ_CST) || atomic_load(&d->s->grant) != d->grant ||
        __atomic_load_n(&d->idle_from, __ATOMIC_RELAXED) ||
        (!queued && __atomic_load_n(&d->sync_gap, __ATOMIC_RELAXED)) ||
        queued + __atomic_load_n(&d->launching, __ATOMIC_RELAXED) >= __atomic_load_n(&d->depth_now, __ATOMIC_RELAXED))
        return 0;
    __atomic_add_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&d->holding, __ATOMIC_SEQ_CST) && atomic_load(&d->s->grant) == d->grant &&
        !__atomic_load_n(&d->idle_from, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&d->launches, 1, __ATOMIC_RELAXED);
        return 1;
    }
    __atomic_sub_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
    return 0;
}

struct vg_ticket vg_sched_admit(CUstream stream)
{
    struct vg_ticket t = {.dev = -1, .stream = stream};
    int dev = device_of(), refused = 0;
    struct sdev *d = sdev_get(dev, &refused);
    if (!d) {
        t.refused = refused;
        return t;
    }
    if (VG_UNLIKELY(d->entry < 0))
        await_entry(d);
    if (!__atomic_load_n(&d->holding, __ATOMIC_RELAXED) && full_share(d))
        return t;
    if (atomic_load_explicit(&vg_captures_open, memory_order_relaxed) && vg_stream_capturing(stream))
        return t; /* recorded into a graph, not run: the graph's launch is charged */
    t.dev = dev;
    if (admit_fast(d))
        return t;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        if (d->holding && atomic_load(&d->s->grant) == d->grant) {
            int others = atomic_load(&d->s->contended) || atomic_load(&d->s->active) > 1;
            if (queued_of(d) + d->launching < depth(d, others))
                break;
        } else if (!d->asked_from) {
            d->asked_from = vg_broker_now(); /* the app wants to launch from now on */
        }
        if (!d->holding && !d->acquiring && !d->draining) {
            /* (One hold at a time: a revoked hold's drain is reported before the next request.) */
            d->acquiring = 1;
            if (d->gave_from) {
                /* How long the app let its queue stay empty: until it first wanted to launch
                 * again (the wait for a grant is the broker's, and the wait for our own
                 * drain report ours: neither is a gap in its work). */
                d->long_gaps = vg_hold_long_gap(d->gave_from, d->asked_from, sync_back(d));
                d->gave_from = 0;
            }
            pthread_mutex_unlock(&g_lock);
            uint32_t g = 0;
            acquire(d, &g);
            pthread_mutex_lock(&g_lock);
            d->acquiring = 0;
            d->asked_from = 0;
            d->holding = 1;
            d->grant = g;
            d->seq = g >> 8;
            d->idle_total = 0;
            d->idle_from = 0;
            d->first_gap = d->first_start = 0;
            d->turn_watch = 0;
            d->last_launch = vg_broker_now();
            /* From the grant: waking up to it is not GPU time (the broker believes a
             * claim only within the hold it dates itself). */
            d->hold_from = atomic_load(&d->s->grant_ns);
            if (d->hold_from > d->last_launch)
                d->hold_from = d->last_launch;
            d->depth_now = depth(d, 1);
            start_thread();
            pthread_cond_signal(&g_thread_cond);
            pthread_cond_broadcast(&g_cond);
            continue;
        }
        pthread_cond_signal(&g_thread_cond);
        struct timespec ts = deadline_in(MS);
        pthread_cond_timedwait(&g_cond, &g_lock, &ts);
    }
    if (d->idle_from || !queued_of(d)) {
        /* The queue was empty: the GPU starts on our work now. It sat empty since our work
         * ended on the GPU's clock (known once every launch is closed by a reaped event,
         * which the holder thread's claim or an app's sync saw), or since the grant. */
        uint64_t now = vg_broker_now(), from = now;
        if (d->idle_from)
            from = d->idle_from;
        else if (!d->launching && d->npend == 0 && d->launches == d->done)
            from = vg_ledger_end_cpu(&d->led, d->hold_from);
        int first = from <= d->hold_from; /* (the wait for the grant is not the app's gap) */
        if (from < d->hold_from)
            from = d->hold_from;
        if (first && !d->first_start)
            d->first_gap = (now > from ? now - from : 0) + 1; /* (1: a start to date) */
        if (from > now)
            from = now;
        if (!first)
            d->long_gaps = vg_hold_long_gap(from, now, sync_back(d));
        /* (idle_since first: the broker may count a spell short, never twice) */
        atomic_store(&d->q->idle_since, 0);
        d->idle_total += now - from;
        atomic_store(&d->q->idle_ns, d->idle_total);
        d->idle_from = 0;
        /* The work starts again now: a start event dates it on the GPU's clock (and keeps
         * the clock map exact: it completes as it is recorded). */
        vg_ledger_gap(&d->led, now);
        int claim = first && d->first_gap && !d->first_start;
        if (record(d, stream, claim ? START_FIRST : START) == 0 && claim)
            d->first_start = t.start_serial = d->ev_serial;
        d->last_launch = now;
        d->sync_gap = 0;
        t.idle_to = now;
    }
    __atomic_add_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
    t.nth = __atomic_add_fetch(&d->launches, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_lock);
    return t;
}

/* ---- stream capture (hooks_launch.c counts the captures) ---- */

_Atomic int vg_captures_open;

int vg_stream_capturing(CUstream s)
{
    static CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
    if (!is_capturing)
        is_capturing = (CUresult(*)(CUstream, CUstreamCaptureStatus *))vg_driver_sym("cuStreamIsCapturing");
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing && is_capturing(s, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

void vg_capture_closed(void)
{
    int n = atomic_load(&vg_captures_open);
    while (n > 0 && !atomic_compare_exchange_weak(&vg_captures_open, &n, n - 1))
        ;
}

/* An event for the current context: reused when one is free. */
static int take_event(struct sdev *d, struct ev *out)
{
    CUcontext ctx = NULL;
    if (p_ctx_current(&ctx) != CUDA_SUCCESS)
        return -1;
    for (unsigned i = d->nfree; i-- > 0;) {
        if (d->freel[i].ctx == ctx) {
            *out = d->freel[i];
            d->freel[i] = d->freel[--d->nfree];
            return 0;
        }
    }
    out->ctx = ctx;
    /* Blocking: the holder thread waits on these; without the flag the driver busy-waits,
     * a CPU core for every throttled process with work queued. Timed: their GPU times are
     * what our work is charged by (ledger.h). */
    return p_event_create(&out->ev, CU_EVENT_BLOCKING_SYNC) == CUDA_SUCCESS ? 0 : -1;
}

void vg_sched_done(struct vg_ticket t, CUresult rc)
{
    if (t.dev < 0)
        return;
    struct sdev *d = &g_dev[t.dev];
    if (rc != CUDA_SUCCESS) {
        __atomic_sub_fetch(&d->launches, 1, __ATOMIC_SEQ_CST); /* nothing was queued */
        __atomic_sub_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
        return;
    }
    /* An event closes ~EVENT_EVERY_NS of launches, a stream change, or the first launch
     * on an empty queue; launches in between take no lock, even with no event pending
     * (a close recorded by a sync, a query or the holder's look closes them: an event at
     * every launch cost ~1 us per launch of kernels shorter than the holder's look). */
    uint64_t since = __atomic_load_n(&d->launches, __ATOMIC_RELAXED) - __atomic_load_n(&d->ev_mark, __ATOMIC_RELAXED);
    if (!t.idle_to && since < __atomic_load_n(&d->every, __ATOMIC_RELAXED) && t.stream == d->ev_stream) {
        __atomic_sub_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
        return;
    }
    pthread_mutex_lock(&g_lock);
    if (t.idle_to && d->holding && d->last_launch == t.idle_to && __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST) == t.nth) {
        uint64_t now = vg_broker_now();
        if (!t.start_serial) { /* (the hold's first launch: claim_start) */
            d->idle_total += now - t.idle_to;
            atomic_store(&d->q->idle_ns, d->idle_total);
        }
    }
    record(d, t.stream, CLOSE);
    __atomic_sub_fetch(&d->launching, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_lock);
}

/* The app waits for its queued work (close: a stream's or the context's, all of it). An
 * event recorded now, while that work still runs, dates its end on the GPU's clock; the
 * app's return from the wait dates nothing.
 * If our queue's last empty spell outlasted VG_HOLD_GAP_NS (a step loop's CPU work after its
 * sync), the GPU would sit idle through the next one while another slice waits: offer the
 * hold back now. The broker revokes it if anyone waits; our queued work runs out as a
 * revoked hold's tail, charged to us, with the next holder's work queued behind it, so
 * the hand-over leaves the GPU no idle gap. Lock-free reads: a stale one offers a hold
 * back once too often or too few, nothing worse. A query (offer 0) offers nothing: an
 * app may poll while it goes on launching. */
struct vg_sync vg_sched_sync(int offer, int close)
{
    struct vg_sync s = {device_of(), UINT64_MAX, 0};
    if (s.dev < 0 || s.dev >= VG_MAX_DEVICES || g_dev[s.dev].state != ST_ON) {
        s.dev = -1;
        return s;
    }
    struct sdev *d = &g_dev[s.dev];
    if (offer) {
        s.waiting = 1;
        __atomic_add_fetch(&d->syncs_in, 1, __ATOMIC_SEQ_CST);
    }
    if (!__atomic_load_n(&d->launching, __ATOMIC_SEQ_CST))
        s.launches = __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST);
    if (close && __atomic_load_n(&d->holding, __ATOMIC_RELAXED) &&
        __atomic_load_n(&d->launches, __ATOMIC_RELAXED) > __atomic_load_n(&d->ev_mark, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&g_lock);
        if (d->holding && !d->launching && d->launches > d->ev_mark)
            close_uncovered(d);
        pthread_mutex_unlock(&g_lock);
    }
    if (!offer || !__atomic_load_n(&d->holding, __ATOMIC_RELAXED) || !d->long_gaps || !atomic_load(&d->s->contended) ||
        !queued_of(d) || d->yielded == d->seq)
        return s;
    d->yielded = d->seq;
    atomic_store(&d->q->yield_seq, d->seq);
    vg_broker_ring(d->s);
    return s;
}

/* The app's wait ended: the events it covered have completed. Reaped now, they tell the
 * next launch, if our queue is empty, when our work ended (a step loop that launches
 * before the holder thread looks would otherwise be charged its sync gap as GPU time). */
void vg_sched_synced(struct vg_sync s, int ok)
{
    if (s.dev < 0)
        return;
    struct sdev *d = &g_dev[s.dev];
    if (s.waiting) {
        __atomic_store_n(&d->sync_back, vg_broker_now(), __ATOMIC_SEQ_CST);
        __atomic_sub_fetch(&d->syncs_in, 1, __ATOMIC_SEQ_CST);
    }
    if (!ok)
        return;
    if (!s.waiting && __atomic_load_n(&d->polled, __ATOMIC_RELAXED)) {
        /* A query that found the work done after one that found it running: the app
         * learnt only now that its work ended (hold.h, "gap"). */
        __atomic_store_n(&d->sync_back, vg_broker_now(), __ATOMIC_SEQ_CST);
        __atomic_store_n(&d->polled, 0, __ATOMIC_SEQ_CST);
    }
    if (!__atomic_load_n(&d->holding, __ATOMIC_RELAXED))
        return;
    if (!__atomic_load_n(&d->sync_gap, __ATOMIC_RELAXED))
        __atomic_store_n(&d->sync_gap, 1, __ATOMIC_RELAXED);
    /* The lock only when there is something to reap: a ring of event syncs (one per
     * launch) with nothing pending takes none. */
    if (!(queued_of(d) && __atomic_load_n(&d->npend, __ATOMIC_RELAXED)))
        return;
    pthread_mutex_lock(&g_lock);
    if (d->holding && d->npend) {
        CUstreamCaptureMode old;
        int relaxed = relax(&old);
        reap(d);
        unrelax(relaxed, old);
    }
    pthread_mutex_unlock(&g_lock);
}

/* A query found the work still running: the app polls for it (hold.h, "wait"). */
void vg_sched_polling(struct vg_sync s)
{
    if (s.dev < 0 || s.waiting)
        return;
    struct sdev *d = &g_dev[s.dev];
    __atomic_store_n(&d->polled, 1 + __atomic_load_n(&d->launches, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
}

/* A process that exits while holding gives the token back at once instead of
 * leaving the others to wait for the broker to revoke it. */
__attribute__((destructor)) static void give_back_at_exit(void)
{
    for (int i = 0; i < VG_MAX_DEVICES; i++) {
        struct sdev *d = &g_dev[i];
        if (d->state == ST_ON && __atomic_load_n(&d->holding, __ATOMIC_RELAXED)) {
            atomic_store(&d->q->release_ns, vg_broker_now());
            atomic_store(&d->q->release_seq, d->seq);
            vg_broker_ring(d->s);
        }
    }
}
