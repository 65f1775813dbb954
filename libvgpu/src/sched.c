/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sched.c - compute shares and priority (DESIGN.md, Compute; vgpu_sched.h).
 *
 * A slice whose share is below 100% submits work only while this process
 * holds its GPU's token. The holder is charged the wall time from taking the
 * token until its last launch has completed, so what a slice is charged is
 * the GPU time it really had, whatever its kernels cost, graphs included.
 * Each slice earns credit at its share of wall time; `fixed` slices run only
 * on credit, `burst` slices may also take the token when no slice with
 * credit waits for it. A higher-priority slice that is active makes lower
 * ones yield (at launch granularity: work already queued finishes) unless
 * they still have floor credit.
 *
 * Threads: application threads wait in vg_sched_admit and record one event
 * after each launch; one thread per process (started on the first hold)
 * reaps those events, charges, renews the token's lease and gives the token
 * back when the process goes idle or must yield. A 100% slice with nobody of
 * higher priority active takes none of this: one clock read per launch.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../include/vgpu_sched.h"
#include "vgpu_internal.h"

#define US 1000ull
#define MS 1000000ull
#define QUANTUM_NS (10 * MS)       /* longest hold while another slice with equal claim waits */
#define START_CREDIT_NS (2 * MS)   /* a slice new on the GPU may start at once */
#define MIN_HOLD_NS (2 * MS)       /* a fixed slice waits for this much credit: fewer hand-overs */
#define CREDIT_CAP_NS (20 * MS)    /* the most credit an idle slice keeps */
#define DEBT_CAP_NS (20 * MS)      /* burst: idle time used beyond the share is not owed past this */
#define IDLE_RELEASE_NS (200 * US) /* a holder with nothing queued and no launch this long lets go */
#define LEASE_NS (200 * MS)        /* a holder silent this long is presumed dead */
#define ACTIVE_NS (5 * MS)         /* "active": launched, held or waited within this */
#define POLL_NS (100 * US)         /* the holder's thread looks at its queue this often */
#define QUEUE_NS (4 * MS)          /* queued work a holder keeps ahead of the GPU: hides wake-ups */
#define TOUCH_NS (100 * US)        /* activity stamps are refreshed at most this often */
#define STALE_ENTRY_NS (60000 * MS)/* an entry unused this long may go to another slice */
#define AWAIT_DRAIN_NS (50 * MS)   /* a former holder that never reports its drain is dead */
#define PEND_MAX 256u
#define FREE_MAX 64u

struct ev {
    CUevent ev;
    CUcontext ctx;
};

struct sdev {
    int state;                   /* 0 not looked at, 1 scheduled, -1 not scheduled */
    struct vgpu_sched *s;
    struct vgpu_sched_entry *e;
    struct vgpu_region *r;
    int idx;                     /* entry index */
    /* under g_lock: */
    int holding, yield, acquiring, on_floor;
    int draining;                /* gave the token back; its queued work still runs (and is charged) */
    unsigned fast_launches;      /* launches on the fast path, for its occasional stamp */
    unsigned launching;          /* admitted launches not yet recorded */
    uint32_t token;
    uint32_t await_token;        /* the former holder whose queued work runs before ours */
    uint64_t hold_start, charge_ts, last_launch, last_touch, completed;
    uint64_t hold_charged;       /* GPU time charged in this hold: with completed, the kernel length */
    struct ev pend[PEND_MAX];
    unsigned npend;
    struct ev freel[FREE_MAX];
    unsigned nfree;
};

static struct sdev g_dev[VG_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;        /* app threads (init_conds) */
static pthread_cond_t g_thread_cond; /* the holder's thread */
static int g_thread_started;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

/* Driver entry points we call but do not hook. */
static CUresult (*p_event_create)(CUevent *, unsigned);
static CUresult (*p_event_record)(CUevent, CUstream);
static CUresult (*p_event_query)(CUevent);
static CUresult (*p_event_sync)(CUevent);
static CUresult (*p_event_destroy)(CUevent);
static CUresult (*p_ctx_current)(CUcontext *);
static CUresult (*p_is_capturing)(CUstream, CUstreamCaptureStatus *);

/* The kernel's tick-granular clock: a few ns, for the per-launch fast path.
 * It lags the precise clock by at most a tick, so "active within the last
 * 5 ms" judged by it errs towards active. */
static uint64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC ns from now, for the timed waits on g_cond / g_thread_cond. */
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

static void futex_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    /* Shared mapping: a process-shared futex (no FUTEX_PRIVATE_FLAG). */
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- credit: pure arithmetic on an entry ---- */

static void add_capped(_Atomic int64_t *b, int64_t add, int64_t cap)
{
    int64_t cur = atomic_load(b), next;
    do {
        next = cur + add;
        if (next > cap)
            next = cur > cap ? cur : cap;
    } while (!atomic_compare_exchange_weak(b, &cur, next));
}

static void sub_floored(_Atomic int64_t *b, int64_t sub, int64_t floor)
{
    int64_t cur = atomic_load(b), next;
    do {
        next = cur - sub;
        if (next < floor)
            next = cur < floor ? cur : floor;
    } while (!atomic_compare_exchange_weak(b, &cur, next));
}

/* Earn share% (and floor%) of the wall time since the last refill. Any
 * process of the slice may do it; the CAS on budget_ts hands each interval
 * to exactly one of them. */
static void refill(struct vgpu_sched_entry *e, uint64_t now)
{
    uint64_t ts = atomic_load(&e->budget_ts);
    if (now <= ts || !atomic_compare_exchange_strong(&e->budget_ts, &ts, now))
        return;
    uint64_t dt = now - ts;
    if (dt > 10 * CREDIT_CAP_NS)
        dt = 10 * CREDIT_CAP_NS; /* anything longer fills the cap anyway; no overflow */
    add_capped(&e->budget_ns, (int64_t)(dt * atomic_load(&e->share) / 100), CREDIT_CAP_NS);
    uint32_t floor = atomic_load(&e->floor);
    if (floor)
        add_capped(&e->floor_budget_ns, (int64_t)(dt * floor / 100), CREDIT_CAP_NS);
}

/* Credit as of now, without writing (for judging other slices). */
static int64_t credit_at(const struct vgpu_sched_entry *e, uint64_t now, int floor)
{
    uint64_t ts = atomic_load(&e->budget_ts);
    int64_t b = atomic_load(floor ? &e->floor_budget_ns : &e->budget_ns);
    uint32_t pct = atomic_load(floor ? &e->floor : &e->share);
    if (now > ts) {
        uint64_t dt = now - ts;
        if (dt > 10 * CREDIT_CAP_NS)
            dt = 10 * CREDIT_CAP_NS;
        int64_t next = b + (int64_t)(dt * pct / 100);
        b = next > (int64_t)CREDIT_CAP_NS ? (b > (int64_t)CREDIT_CAP_NS ? b : (int64_t)CREDIT_CAP_NS) : next;
    }
    return b;
}

static int higher_active(const struct vgpu_sched *s, uint32_t prio, uint64_t now)
{
    for (uint32_t p = prio + 1; p <= VGPU_PRIORITY_HIGH; p++) {
        uint64_t t = atomic_load(&s->prio_active_ns[p]);
        if (t && t + ACTIVE_NS > now) /* (a stamp newer than `now` is active too) */
            return 1;
    }
    return 0;
}

struct standing {
    int eligible;  /* may take the token now */
    int on_floor;  /* only through its floor (a higher priority is active) */
    int floor_due; /* on its floor with floor credit: owed time even over higher priorities */
    uint32_t prio;
    int credit;    /* has credit */
    int64_t norm;  /* credit per share: who is owed most */
};

static struct standing standing_of(const struct vgpu_sched *s, const struct vgpu_sched_entry *e, uint64_t now)
{
    struct standing st = {0};
    uint32_t share = atomic_load(&e->share);
    st.prio = atomic_load(&e->priority);
    int64_t credit = credit_at(e, now, 0);
    st.credit = credit > 0;
    st.norm = credit * 100 / (share ? share : 1);
    if (higher_active(s, st.prio, now)) {
        st.on_floor = 1;
        st.eligible = st.floor_due = atomic_load(&e->floor) && credit_at(e, now, 1) >= (int64_t)MIN_HOLD_NS;
    } else if (atomic_load(&e->policy) == VGPU_POLICY_FIXED) {
        st.eligible = credit >= (int64_t)MIN_HOLD_NS;
    } else {
        st.eligible = 1;
    }
    return st;
}

static int better(const struct standing *a, const struct standing *b)
{
    if (a->floor_due != b->floor_due)
        return a->floor_due; /* the floor is a guarantee: it beats priority */
    if (a->prio != b->prio)
        return a->prio > b->prio;
    if (a->credit != b->credit)
        return a->credit > b->credit;
    return a->norm > b->norm;
}

/* The best eligible waiter of another slice, if it ranks above `me`. */
static int better_waiter(const struct vgpu_sched *s, int self, const struct standing *me, uint64_t now,
                         struct standing *out)
{
    int found = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        const struct vgpu_sched_entry *e = &s->entries[i];
        if ((int)i == self || !atomic_load(&e->key) || !atomic_load(&e->waiting))
            continue;
        if (now - atomic_load(&e->wait_heartbeat_ns) > ACTIVE_NS)
            continue; /* its waiters died or sleep until they are eligible */
        struct standing st = standing_of(s, e, now);
        if (st.eligible && better(&st, me) && (!found || better(&st, out))) {
            *out = st;
            found = 1;
        }
    }
    return found;
}

/* ---- the token ---- */

static int token_take(struct vgpu_sched *s, int idx, uint64_t now, uint32_t *out)
{
    uint32_t cur = atomic_load(&s->token);
    if (cur) {
        /* A lapsed lease means a dead (or stopped) holder; make sure the lease
         * seen belongs to this holder, not to one that took it a moment ago. */
        if (now < atomic_load(&s->token_lease_ns))
            return 0;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
        if (atomic_load(&s->token) != cur || now_ns() < atomic_load(&s->token_lease_ns))
            return 0;
    }
    uint32_t v = ((atomic_fetch_add(&s->token_seq, 1) + 1) << 8) | (uint32_t)(idx + 1);
    if (!atomic_compare_exchange_strong(&s->token, &cur, v))
        return 0;
    atomic_store(&s->token_lease_ns, now + LEASE_NS);
    atomic_store(&s->token_entry, (uint32_t)(idx + 1));
    atomic_store(&s->token_since_ns, now);
    atomic_store(&s->token_pid, (uint32_t)getpid());
    atomic_fetch_add(&s->handoffs, 1);
    *out = v;
    return 1;
}

static void token_give(struct vgpu_sched *s, uint32_t v)
{
    uint32_t cur = v;
    if (atomic_compare_exchange_strong(&s->token, &cur, 0))
        atomic_store(&s->token_entry, 0);
    futex_wake_all(&s->token);
}

/* ---- per-device setup ---- */

static struct vgpu_sched *map_sched(int fd)
{
    void *m = mmap(NULL, sizeof(struct vgpu_sched), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

static void fill_sched(struct vgpu_sched *s, const char *uuid)
{
    s->version = VGPU_SCHED_VERSION;
    s->size = sizeof(*s);
    s->entry_capacity = VGPU_SCHED_ENTRIES;
    snprintf(s->uuid, sizeof(s->uuid), "%s", uuid);
    atomic_store((_Atomic uint32_t *)&s->magic, VGPU_SCHED_MAGIC);
}

static void fill_new_sched(void *map, void *uuid)
{
    fill_sched(map, uuid);
}

static int sched_valid(const struct vgpu_sched *s)
{
    return s->magic == VGPU_SCHED_MAGIC && s->version == VGPU_SCHED_VERSION && s->size == sizeof(*s) &&
           s->entry_capacity == VGPU_SCHED_ENTRIES;
}

/* Open dir/name, creating it (atomically, like the slice regions) unless
 * the arbiter owns the directory. NULL with *why set on failure. */
static struct vgpu_sched *open_sched(const char *path, const char *uuid, int create, const char **why)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            struct stat sb;
            struct vgpu_sched *s = NULL;
            if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(struct vgpu_sched))
                s = map_sched(fd);
            close(fd);
            if (s && sched_valid(s))
                return s;
            if (s)
                munmap(s, sizeof(*s));
            *why = "not a vgpu scheduling region of this version";
            return NULL;
        }
        if (errno != ENOENT || !create) {
            *why = strerror(errno);
            return NULL;
        }
        /* Every user of the GPU maps it read-write, whatever its umask. */
        struct vgpu_sched *s = vg_create_linked(path, sizeof(*s), 0666, 1, fill_new_sched, (void *)uuid);
        if (s)
            return s;
        if (errno != EEXIST) {
            *why = strerror(errno);
            return NULL;
        }
    }
    *why = "could not be created";
    return NULL;
}

static struct vgpu_sched *private_sched(const char *uuid)
{
    void *m = mmap(NULL, sizeof(struct vgpu_sched), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    fill_sched(m, uuid);
    return m;
}

static void entry_copy(struct vgpu_sched *s, struct vgpu_sched_entry *e, const struct vgpu_region *r)
{
    uint32_t share = atomic_load(&r->compute_share);
    atomic_store(&e->share, share < 2 ? 2 : share > 100 ? 100 : share);
    uint32_t prio = atomic_load(&r->priority);
    prio = prio > VGPU_PRIORITY_HIGH ? VGPU_PRIORITY_NORMAL : prio;
    atomic_store(&e->priority, prio);
    if (!(atomic_load(&s->prio_mask) & (1u << prio)))
        atomic_fetch_or(&s->prio_mask, 1u << prio);
    atomic_store(&e->policy, atomic_load(&r->policy));
    atomic_store(&e->floor, atomic_load(&r->priority_floor));
}

static int claim_entry(struct vgpu_sched *s, uint64_t key, const struct vgpu_region *r, uint64_t now)
{
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        if (atomic_load(&s->entries[i].key) == key)
            return (int)i;
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
            struct vgpu_sched_entry *e = &s->entries[i];
            uint64_t k = atomic_load(&e->key);
            /* pass 0: free entries; pass 1: entries of slices long gone. */
            if (pass == 0 ? k != 0 : now - atomic_load(&e->last_active_ns) < STALE_ENTRY_NS)
                continue;
            if (!atomic_compare_exchange_strong(&e->key, &k, key))
                continue;
            entry_copy(s, e, r);
            atomic_store(&e->budget_ts, now);
            atomic_store(&e->budget_ns, (int64_t)START_CREDIT_NS);
            atomic_store(&e->floor_budget_ns, 0);
            atomic_store(&e->used_ns, 0);
            atomic_store(&e->waiting, 0);
            atomic_store(&e->holds, 0);
            atomic_store(&e->last_active_ns, now);
            return (int)i;
        }
    }
    return -1;
}

/* Timed waits on the monotonic clock: a wall-clock jump must not stall hand-overs. */
static void init_conds(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &attr);
    pthread_cond_init(&g_thread_cond, &attr);
    pthread_condattr_destroy(&attr);
}

static void after_fork_child(void)
{
    /* The child holds no token and has no thread; its events are the parent's. */
    pthread_mutex_init(&g_lock, NULL);
    init_conds();
    g_thread_started = 0;
    for (int i = 0; i < VG_MAX_DEVICES; i++) {
        struct sdev *d = &g_dev[i];
        d->holding = d->yield = d->acquiring = d->draining = 0;
        d->await_token = 0;
        d->launching = d->npend = d->nfree = 0;
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
    p_is_capturing = (CUresult(*)(CUstream, CUstreamCaptureStatus *))vg_driver_sym("cuStreamIsCapturing");
    return p_event_create && p_event_record && p_event_query && p_event_sync && p_event_destroy && p_ctx_current;
}

/* Set device dev up once (under g_lock). */
static void sdev_init(struct sdev *d, int dev)
{
    d->state = -1;
    struct vgpu_region *r = vg_region(dev);
    if (!r || !look_up_driver())
        return;
    pthread_once(&g_atfork_once, register_atfork);
    char name[VGPU_REGION_UUID_LEN + 8];
    if (r->uuid[0])
        snprintf(name, sizeof(name), "%s", r->uuid);
    else
        snprintf(name, sizeof(name), "gpu%d", dev);
    struct vgpu_sched *s = NULL;
    if (vg_cfg.sched_dir[0]) {
        char path[400];
        const char *why = "";
        snprintf(path, sizeof(path), "%s/%s", vg_cfg.sched_dir, name);
        s = open_sched(path, r->uuid, !vg_cfg.sched_from_arbiter, &why);
        if (!s)
            fprintf(stderr, "vgpu: %s: %s; compute shares are enforced in this process alone\n", path, why);
    }
    if (!s && !(s = private_sched(r->uuid)))
        return;
    uint64_t key = atomic_load(&r->slice_key);
    if (!key) {
        /* A region from an arbiter without slice keys: the first process names it. */
        uint64_t fresh = vg_random_key();
        atomic_compare_exchange_strong(&r->slice_key, &key, fresh);
        key = atomic_load(&r->slice_key);
    }
    int idx = claim_entry(s, key, r, now_ns());
    if (idx < 0) {
        fprintf(stderr, "vgpu: the scheduling region of %s is full; compute shares are not enforced\n", name);
        return;
    }
    d->s = s;
    d->r = r;
    d->idx = idx;
    d->e = &s->entries[idx];
    d->state = 1;
}

static struct sdev *sdev_get(int dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return NULL;
    struct sdev *d = &g_dev[dev];
    int st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (VG_LIKELY(st != 0))
        return st > 0 ? d : NULL;
    pthread_mutex_lock(&g_lock);
    if (d->state == 0) {
        sdev_init(d, dev);
        __atomic_store_n(&d->state, d->state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return d->state > 0 ? d : NULL;
}

/* Stamp the slice and its priority as active (rate-limited: shared lines). */
static void touch(struct sdev *d, uint64_t now)
{
    if (now < d->last_touch + TOUCH_NS)
        return;
    d->last_touch = now;
    entry_copy(d->s, d->e, d->r);
    atomic_store(&d->e->last_active_ns, now);
    uint32_t p = atomic_load(&d->e->priority);
    atomic_store(&d->s->prio_active_ns[p], now);
}

/* ---- charging and giving back (under g_lock) ---- */

static void charge(struct sdev *d, uint64_t now, int dev)
{
    if (d->await_token) {
        /* Our work queues behind the former holder's: our time starts when its ends. */
        if (atomic_load(&d->s->drain_token) == d->await_token && now - d->hold_start < AWAIT_DRAIN_NS)
            return;
        uint64_t from = atomic_load(&d->s->drain_ns);
        d->charge_ts = from > d->hold_start && from < now ? from : d->hold_start;
        d->await_token = 0;
    }
    if (now <= d->charge_ts)
        return;
    uint64_t dt = now - d->charge_ts;
    d->charge_ts = now;
    struct vgpu_sched_entry *e = d->e;
    refill(e, now);
    int burst = atomic_load(&e->policy) == VGPU_POLICY_BURST;
    sub_floored(&e->budget_ns, (int64_t)dt, burst ? -(int64_t)DEBT_CAP_NS : INT64_MIN);
    if (d->on_floor)
        sub_floored(&e->floor_budget_ns, (int64_t)dt, -(int64_t)DEBT_CAP_NS);
    atomic_fetch_add(&e->used_ns, dt);
    d->hold_charged += dt;
    vg_note_busy(dev, dt, now);
}

/* Our last queued work completed: stop charging and tell the next holder. */
static void drained(struct sdev *d, uint64_t now, int dev)
{
    charge(d, now, dev);
    d->draining = 0;
    uint32_t mine = d->token;
    atomic_store(&d->s->drain_ns, now);
    atomic_compare_exchange_strong(&d->s->drain_token, &mine, 0);
}

/* Hand the token over now; work still queued keeps being charged to us
 * until it completes, and the next holder's charge starts from there. */
static void give_back(struct sdev *d, uint64_t now, int dev)
{
    charge(d, now, dev);
    d->holding = d->yield = 0;
    if (d->npend) {
        d->draining = 1;
        atomic_store(&d->s->drain_token, d->token);
    } else {
        drained(d, now, dev);
    }
    token_give(d->s, d->token);
    pthread_cond_broadcast(&g_cond);
}

static int should_yield(struct sdev *d, uint64_t now)
{
    struct vgpu_sched_entry *e = d->e;
    struct standing me = standing_of(d->s, e, now), other;
    if (me.on_floor && !d->on_floor)
        return 1; /* preempted by a higher priority */
    if (d->on_floor && credit_at(e, now, 1) <= 0)
        return 1;
    if (atomic_load(&e->policy) == VGPU_POLICY_FIXED && credit_at(e, now, 0) <= 0)
        return 1;
    int quantum = now - d->hold_start >= QUANTUM_NS;
    if (better_waiter(d->s, d->idx, &me, now, &other))
        return other.prio > me.prio || other.floor_due || !me.credit || quantum;
    /* Other processes of this slice take turns too. */
    return quantum && atomic_load(&e->waiting) && now - atomic_load(&e->wait_heartbeat_ns) < ACTIVE_NS;
}

/* Events whose work completed go back to the free list. */
static void reap(struct sdev *d)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < d->npend; i++) {
        CUresult rc = p_event_query(d->pend[i].ev);
        if (rc == CUDA_ERROR_NOT_READY) {
            d->pend[kept++] = d->pend[i];
            continue;
        }
        d->completed++;
        if (rc == CUDA_SUCCESS && d->nfree < FREE_MAX)
            d->freel[d->nfree++] = d->pend[i];
        else if (rc == CUDA_SUCCESS)
            p_event_destroy(d->pend[i].ev);
        /* any other answer: its context is gone, and the event with it */
    }
    d->npend = kept;
}

/* The holder's thread: reaps, charges, renews the lease, lets go. */
static void *holder_thread(void *arg)
{
    (void)arg;
    prctl(PR_SET_TIMERSLACK, 1UL); /* hand-overs wait on this thread's sleeps */
    pthread_mutex_lock(&g_lock);
    for (;;) {
        int held = 0;
        uint64_t now = now_ns();
        for (int dev = 0; dev < VG_MAX_DEVICES; dev++) {
            struct sdev *d = &g_dev[dev];
            if (d->state <= 0 || !(d->holding || d->draining))
                continue;
            held = 1;
            reap(d);
            if (d->npend || d->launching)
                touch(d, now);
            if (d->draining && !d->holding) {
                if (d->npend) {
                    /* Block on our last event: the drain is charged to the
                     * moment it completes, not to the next poll. */
                    CUevent last = d->pend[d->npend - 1].ev;
                    pthread_mutex_unlock(&g_lock);
                    p_event_sync(last);
                    pthread_mutex_lock(&g_lock);
                    reap(d);
                    now = now_ns();
                }
                if (d->draining && !d->holding && !d->npend)
                    drained(d, now, dev);
                continue;
            }
            atomic_store(&d->s->token_lease_ns, now + LEASE_NS);
            charge(d, now, dev);
            if (!d->yield && should_yield(d, now))
                d->yield = 1;
            if (d->launching)
                continue; /* a launch is between admission and its event */
            if (d->yield || (!d->npend && now - d->last_launch >= IDLE_RELEASE_NS))
                give_back(d, now, dev);
        }
        pthread_cond_broadcast(&g_cond);
        if (!held) {
            pthread_cond_wait(&g_thread_cond, &g_lock);
            continue;
        }
        struct timespec ts = deadline_in(POLL_NS);
        pthread_cond_timedwait(&g_thread_cond, &g_lock, &ts);
    }
    return NULL;
}

static void start_thread(void)
{
    if (g_thread_started)
        return;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals are not ours */
    if (pthread_create(&t, &attr, holder_thread, NULL) == 0)
        g_thread_started = 1;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* Wait (without g_lock) until this slice may take the token, and take it. */
static void acquire(struct sdev *d, uint64_t *taken_at, int *on_floor, uint32_t *token)
{
    struct vgpu_sched *s = d->s;
    struct vgpu_sched_entry *e = d->e;
    atomic_fetch_add(&e->waiting, 1);
    for (;;) {
        uint64_t now = now_ns();
        entry_copy(s, e, d->r);
        refill(e, now);
        atomic_store(&e->last_active_ns, now);
        struct standing me = standing_of(s, e, now), other;
        uint32_t seen = atomic_load(&s->token);
        uint64_t sleep_ns = MS;
        if (me.eligible) {
            atomic_store(&e->wait_heartbeat_ns, now);
            if (!me.on_floor)
                atomic_store(&s->prio_active_ns[me.prio], now);
            if (!better_waiter(s, d->idx, &me, now, &other) && token_take(s, d->idx, now, token)) {
                *taken_at = now;
                *on_floor = me.on_floor;
                break;
            }
        } else if (me.on_floor && atomic_load(&e->floor)) {
            int64_t missing = (int64_t)MIN_HOLD_NS - credit_at(e, now, 1);
            uint32_t floor = atomic_load(&e->floor);
            uint64_t t = missing > 0 ? (uint64_t)missing * 100 / floor : 0;
            sleep_ns = t < 50 * US ? 50 * US : t > ACTIVE_NS ? ACTIVE_NS : t;
        } else if (!me.on_floor) {
            /* A fixed slice short of credit: sleep until it has earned enough. */
            int64_t missing = (int64_t)MIN_HOLD_NS - credit_at(e, now, 0);
            uint32_t share = atomic_load(&e->share);
            uint64_t t = missing > 0 ? (uint64_t)missing * 100 / (share ? share : 1) : 0;
            sleep_ns = t < 50 * US ? 50 * US : t > 50 * MS ? 50 * MS : t;
        }
        futex_wait(&s->token, seen, sleep_ns);
    }
    atomic_fetch_sub(&e->waiting, 1);
    atomic_fetch_add(&e->holds, 1);
}

/* Queued launches kept ahead of the GPU: about QUEUE_NS of work. */
static unsigned depth(const struct sdev *d)
{
    if (d->completed < 4 || d->hold_charged < 100 * US)
        return 4;
    uint64_t per = d->hold_charged / d->completed;
    uint64_t n = per ? QUEUE_NS / per : PEND_MAX;
    return n < 2 ? 2 : n > PEND_MAX - 8 ? PEND_MAX - 8 : (unsigned)n;
}

static int device_of(void)
{
    /* One device is the common case: no driver call for it. */
    return vg_region_count() == 1 ? 0 : vg_current_device();
}

struct vg_ticket vg_sched_admit(CUstream stream)
{
    struct vg_ticket t = {-1, stream};
    int dev = device_of();
    struct sdev *d = sdev_get(dev);
    if (!d)
        return t;
    uint32_t share = atomic_load(&d->r->compute_share);
    uint32_t prio = atomic_load(&d->e->priority);
    int full = share >= 100 && !__atomic_load_n(&d->holding, __ATOMIC_RELAXED);
    if (full && atomic_load_explicit(&d->s->prio_mask, memory_order_relaxed) == 1u << prio) {
        /* Only slices of our own priority have used this GPU: nobody to wait for and
         * nobody who waits for us. No clock; a stamp now and then keeps the entry ours. */
        if ((d->fast_launches++ & 4095) == 0)
            touch(d, now_ns());
        return t;
    }
    uint64_t now;
    if (full) {
        /* Not share-limited: only a higher priority holds it back. */
        now = coarse_ns();
        if (now >= d->last_touch + TOUCH_NS)
            touch(d, now_ns());
        while (higher_active(d->s, prio, now) && !(atomic_load(&d->e->floor))) {
            futex_wait(&d->s->token, atomic_load(&d->s->token), ACTIVE_NS / 5);
            now = now_ns();
        }
        if (!higher_active(d->s, prio, now))
            return t;
    }
    now = now_ns(); /* (this VM's clock costs ~80 ns a read: one per throttled launch) */
    touch(d, now);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (p_is_capturing && p_is_capturing(stream, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return t; /* recorded into a graph, not run: the graph's launch is charged */
    pthread_mutex_lock(&g_lock);
    for (int waited = 0;; waited = 1) {
        if (waited)
            now = now_ns();
        if (d->holding && !d->yield) {
            if (d->npend + d->launching < depth(d))
                break;
        } else if (!d->holding && !d->acquiring) {
            d->acquiring = 1;
            pthread_mutex_unlock(&g_lock);
            uint64_t at = 0;
            int on_floor = 0;
            uint32_t token = 0;
            acquire(d, &at, &on_floor, &token);
            pthread_mutex_lock(&g_lock);
            d->acquiring = 0;
            d->holding = 1;
            d->on_floor = on_floor;
            if (d->draining)
                drained(d, at, dev); /* our own queued work: charged straight on */
            d->token = token;
            d->hold_start = d->charge_ts = d->last_launch = at;
            d->await_token = atomic_load(&d->s->drain_token);
            d->completed = d->hold_charged = 0;
            start_thread();
            pthread_cond_signal(&g_thread_cond);
            pthread_cond_broadcast(&g_cond);
            continue;
        }
        struct timespec ts = deadline_in(MS);
        pthread_cond_timedwait(&g_cond, &g_lock, &ts);
    }
    d->launching++;
    d->last_launch = now;
    pthread_mutex_unlock(&g_lock);
    t.dev = dev;
    return t;
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
    return p_event_create(&out->ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS ? 0 : -1;
}

void vg_sched_done(struct vg_ticket t, CUresult rc)
{
    if (t.dev < 0)
        return;
    struct sdev *d = &g_dev[t.dev];
    pthread_mutex_lock(&g_lock);
    struct ev ev;
    if (rc == CUDA_SUCCESS && d->npend < PEND_MAX && take_event(d, &ev) == 0) {
        if (p_event_record(ev.ev, t.stream) == CUDA_SUCCESS)
            d->pend[d->npend++] = ev;
        else
            p_event_destroy(ev.ev); /* e.g. a stream of another context: the hold still covers it */
    }
    d->launching--;
    pthread_mutex_unlock(&g_lock);
}

/* A process that exits while holding hands the token over at once instead
 * of leaving the others to wait for the lease. */
__attribute__((destructor)) static void give_back_at_exit(void)
{
    for (int i = 0; i < VG_MAX_DEVICES; i++) {
        struct sdev *d = &g_dev[i];
        if (d->state > 0 && __atomic_load_n(&d->holding, __ATOMIC_RELAXED))
            token_give(d->s, d->token);
    }
}
