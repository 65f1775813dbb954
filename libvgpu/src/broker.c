/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.c - grants one GPU's token to the slices on it (vgpu_sched.h).
 *
 * The broker is the only writer of the per-GPU file; each slice writes only
 * its own .req file, which the broker reads with pread (a file a tenant
 * truncates reads short, it cannot fault us) and checks field by field.
 *
 * Rules (the same as before the broker, now decided in one trusted place):
 * a slice earns credit at its share of wall time; `fixed` slices take the
 * token only on credit, `burst` slices also when no slice with credit waits;
 * among waiters a higher priority wins, then a slice with credit, then the
 * one owed most per share; a slice that keeps its floor beats priority.
 * A hold is charged by the broker's clock from the grant (or from the end of
 * the previous holder's queued work) to its end, less the time the holder
 * claims its GPU queue sat empty -- honoured only for the part of the hold in
 * which no other slice waited, so no claim moves time onto another slice.
 * A holder that stays past its quantum while others wait, runs out of credit
 * or is outranked loses the token; the work it had queued is charged to it
 * until it reports the drain (latched per hold when first seen: a later report of
 * its own cannot hide it). A tail never reported costs TAIL_MAX and does not
 * hold back the next holder's clock; a grant no process takes within TAKE_NS
 * (a made-up request) is taken back.
 */
#include "broker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../include/vgpu_region.h"

#define US 1000ull
#define MS 1000000ull
#define QUANTUM_NS (10 * MS)       /* longest hold while another slice with equal claim waits */
#define START_CREDIT_NS (2 * MS)   /* a slice new on the GPU may start at once */
#define MIN_HOLD_NS (2 * MS)       /* a fixed slice waits for this much credit: fewer hand-overs */
#define MIN_HOLD_ALONE_NS (1000 * US)/* ... or this much while no other slice waits (no hand-over) */
#define CREDIT_CAP_NS (20 * MS)    /* the most credit an idle slice keeps */
#define CAP_MARGIN_NS (2 * MS)     /* ... and a waiter this close to it loses credit: it goes next */
#define DEBT_CAP_NS (20 * MS)      /* burst: idle time used beyond the share is not owed past this */
#define ACTIVE_NS (5 * MS)         /* "active": requested, held or reported within this */
#define TAIL_MAX_NS (50 * MS)      /* a revoked holder's queued work charged to it at most this long */
#define SEG_MAX 8                  /* holds whose GPU time is not settled yet */
#define CONTENDED_IDLE_DIV 4       /* claimed idle honoured while others wait: a quarter of that time */
#define RELEASE_SLACK_NS (200 * US)/* a release is dated at most this long before the broker saw it */
#define RESCAN_NS (20 * MS)        /* new, changed and gone slices are seen within this */
#define RESCAN_RUNG_NS (2 * MS)   /* ... and within this when a slice rings */
#define PRESENT_NS (1000 * MS)    /* "present": requested, held or reported within this */
#define STALE_NS (60000 * MS)     /* standalone: a slice silent this long is dropped (its file stays) */
#define BEAT_NS (10 * MS)          /* the longest sleep: the heartbeat's period */
#define LEASE_NS (50 * MS)         /* a holder silent this long (dead, stopped) loses the token to a waiter */
#define TAKE_NS (5 * MS)           /* a grant no process of the slice takes this long is taken back */
#define FUTURE_NS (1 * MS)         /* a claimed time later than now by more than this is a lie */

struct bslice {
    uint64_t key;                  /* 0 = free slot */
    int fd;                        /* the .req, read with pread; -1 in private mode */
    struct vgpu_sched_req *mem;    /* private mode: the req itself */
    ino_t conf_ino;
    struct timespec conf_mtime;
    uint32_t share, prio, policy, floor;
    int64_t credit, floor_credit;
    uint64_t credit_ts, last_active, used, registered;
    uint64_t last_seen;            /* last request, hold or report: "present" within PRESENT_NS */
    uint32_t holds;
    uint32_t late_seq;             /* a hold whose tail was settled unreported ... */
    uint64_t late_from;            /* ... charged until then: a later drain report pays the rest */
    struct vgpu_sched_req req;     /* this step's snapshot; zeros when unreadable */
    int waiting, seen;
};

/* A hold whose GPU time is not settled yet. Holds run on the GPU one after
 * another: each one's work starts when the one before it drained. */
struct seg {
    int slice;
    uint32_t seq;
    int on_floor, revoked;
    uint64_t granted;
    uint64_t start;    /* when its work could start; 0 = after the segment before it */
    uint64_t end;      /* when the hold ended (released or revoked); 0 = still held */
    uint64_t idle;     /* idle time it may deduct (fixed when the hold ends) */
    uint64_t penalty;  /* charged on top: a tail never reported */
    int taken;         /* a process of the slice took the grant (seen once: latched) */
    int drained;       /* its slice reported this hold's drain (seen once: latched) ... */
    uint64_t drain_claim, drain_seen; /* ... dated this, seen then */
};

struct vg_bgpu {
    struct vgpu_sched *s;
    char dir[256], uuid[VGPU_SCHED_UUID_LEN];
    int confs, priv;
    struct bslice sl[VGPU_SCHED_ENTRIES];
    /* the current hold (also the last segment) */
    int holder, on_floor;
    uint32_t seq, epoch;          /* epoch: this broker's, from the file (one per broker started) */
    uint64_t granted, uncontended, last_step;
    struct seg seg[SEG_MAX];
    int nseg;
    uint64_t last_scan, sig;
    int rung;                      /* woken by a ring: a new slice may be asking */
    unsigned active;               /* slices active within ACTIVE_NS, as of the last step */
};

uint64_t vg_broker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long futex(_Atomic uint32_t *w, int op, uint32_t val, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    /* Shared mappings: process-shared futexes (no FUTEX_PRIVATE_FLAG). */
    return syscall(SYS_futex, (uint32_t *)w, op, val, op == FUTEX_WAIT ? &ts : NULL, NULL, 0);
}

void vg_futex_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns)
{
    futex(w, FUTEX_WAIT, val, ns);
}

void vg_broker_ring(struct vgpu_sched *s)
{
    /* The broker sets the doorbell, checks every request once more, then
     * sleeps: a wake that finds nobody asleep yet is retried until it finds
     * the broker asleep or awake (bounded: a dead broker never sleeps). */
    for (int i = 0; i < 64 && atomic_load(&s->doorbell); i++) {
        if (futex(&s->doorbell, FUTEX_WAKE, INT_MAX, 0) > 0)
            return;
        sched_yield();
    }
}

int vg_sched_header_ok(const struct vgpu_sched *s)
{
    return s->magic == VGPU_SCHED_MAGIC && s->version == VGPU_SCHED_VERSION && s->size == sizeof(*s) &&
           s->entry_capacity == VGPU_SCHED_ENTRIES;
}

/* A claimed time: within [lo, now + FUTURE_NS], else not believed (0). */
static uint64_t believed(uint64_t t, uint64_t lo, uint64_t now)
{
    return t >= lo && t <= now + FUTURE_NS ? t : 0;
}

/* ---- slices: settings, registration ---- */

static uint32_t clamp_share(uint32_t v)
{
    return v < 2 ? 2 : v > 100 ? 100 : v;
}

static void settings(struct bslice *b, uint32_t share, uint32_t prio, uint32_t policy, uint32_t floor)
{
    b->share = clamp_share(share);
    b->prio = prio > VGPU_PRIORITY_HIGH ? VGPU_PRIORITY_NORMAL : prio;
    b->policy = policy == VGPU_POLICY_BURST ? VGPU_POLICY_BURST : VGPU_POLICY_FIXED;
    b->floor = floor > 100 ? 0 : floor;
}

/* vgpud's .conf of a slice: "share=30 priority=1 policy=0 floor=0". */
static int read_conf(const char *path, struct bslice *b, int force)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    if (!force && sb.st_ino == b->conf_ino && sb.st_mtim.tv_sec == b->conf_mtime.tv_sec &&
        sb.st_mtim.tv_nsec == b->conf_mtime.tv_nsec)
        return 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    unsigned share = 0, prio = VGPU_PRIORITY_NORMAL, policy = 0, floor = 0;
    int n = fscanf(f, "share=%u priority=%u policy=%u floor=%u", &share, &prio, &policy, &floor);
    fclose(f);
    if (n != 4)
        return -1;
    settings(b, share, prio, policy, floor);
    b->conf_ino = sb.st_ino;
    b->conf_mtime = sb.st_mtim;
    return 0;
}

/* This step's copy of a slice's requests: whole and its own, or zeros. */
static void read_req(struct vg_bgpu *g, struct bslice *b)
{
    struct vgpu_sched_req r;
    if (b->mem) {
        memcpy(&r, b->mem, sizeof(r));
    } else if (pread(b->fd, &r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        memset(&b->req, 0, sizeof(b->req));
        return;
    }
    if (r.magic != VGPU_SCHED_REQ_MAGIC || r.version != VGPU_SCHED_VERSION || r.size != sizeof(r) ||
        r.key != b->key) {
        memset(&b->req, 0, sizeof(b->req));
        return;
    }
    b->req = r;
    if (!g->confs)
        settings(b, r.share, r.priority, r.policy, r.floor);
}

static void take_on(struct vg_bgpu *g, int i, uint64_t key, uint64_t now)
{
    struct bslice *b = &g->sl[i];
    b->credit = (int64_t)START_CREDIT_NS;
    b->floor_credit = 0;
    b->credit_ts = b->last_active = b->registered = b->last_seen = now;
    b->used = 0;
    b->holds = 0;
    b->late_seq = 0;
    b->waiting = 0;
    memset(&b->req, 0, sizeof(b->req));
    b->key = key;
    read_req(g, b); /* standalone: the slice's own settings */
    struct vgpu_sched_entry *e = &g->s->entries[i];
    /* Settings before the key: a slice that finds its entry reads them at once. */
    atomic_store(&e->share, b->share);
    atomic_store(&e->priority, b->prio);
    atomic_store(&e->policy, b->policy);
    atomic_store(&e->floor, b->floor);
    atomic_store(&e->registered_ns, now);
    atomic_store(&e->used_ns, 0);
    atomic_store(&e->holds, 0);
    atomic_store(&e->key, key);
}

static void end_hold(struct vg_bgpu *g, uint64_t end, uint64_t now, int revoked);

static void drop(struct vg_bgpu *g, int i, uint64_t now)
{
    struct bslice *b = &g->sl[i];
    if (g->holder == i)
        end_hold(g, now, now, 0);
    for (int k = 0; k < g->nseg; k++)
        if (g->seg[k].slice == i)
            g->seg[k].slice = -1; /* gone: its time is nobody's */
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    b->key = 0;
    atomic_store(&g->s->entries[i].key, 0);
}

static int slot_of(const struct vg_bgpu *g, uint64_t key)
{
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        if (g->sl[i].key == key)
            return (int)i;
    return -1;
}

/* Find .req files beside the GPU file (and their .conf when vgpud runs us). */
static void rescan(struct vg_bgpu *g, uint64_t now)
{
    g->last_scan = now;
    DIR *d = opendir(g->dir);
    if (!d)
        return;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        g->sl[i].seen = 0;
    size_t ulen = strlen(g->uuid);
    struct dirent *de;
    char path[600];
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        /* <uuid>.<16 hex>.req */
        if (len != ulen + 1 + 16 + 4 || strncmp(n, g->uuid, ulen) != 0 || n[ulen] != '.' ||
            strcmp(n + len - 4, ".req") != 0)
            continue;
        char hex[17];
        memcpy(hex, n + ulen + 1, 16);
        hex[16] = 0;
        char *endp;
        uint64_t key = strtoull(hex, &endp, 16);
        if (*endp || !key)
            continue;
        int i = slot_of(g, key);
        int fresh = i < 0;
        if (fresh) {
            for (unsigned j = 0; j < VGPU_SCHED_ENTRIES && i < 0; j++)
                if (!g->sl[j].key)
                    i = (int)j;
            if (i < 0)
                continue; /* full: the slice waits (and says so) until one leaves */
        }
        struct bslice *b = &g->sl[i];
        if (g->confs) {
            snprintf(path, sizeof(path), "%s/%.*s.%s.conf", g->dir, (int)ulen, g->uuid, hex);
            if (read_conf(path, b, fresh) != 0) {
                if (!fresh)
                    drop(g, i, now);
                continue; /* vgpud has not (or no longer) set it up */
            }
        }
        if (fresh) {
            snprintf(path, sizeof(path), "%s/%s", g->dir, n);
            int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            struct stat sb;
            if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                if (fd >= 0)
                    close(fd);
                continue;
            }
            struct vgpu_sched_req r;
            if (!g->confs && (pread(fd, &r, sizeof(r), 0) != (ssize_t)sizeof(r) ||
                              !(believed(r.want_ns, now - STALE_NS, now) ||
                                believed(r.active_ns, now - STALE_NS, now)))) {
                close(fd); /* standalone: a file a process left behind long ago */
                continue;
            }
            b->fd = fd;
            b->mem = NULL;
            take_on(g, i, key, now);
        }
        b->seen = 1;
    }
    closedir(d);
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        int stale = !g->confs && now - b->last_seen > STALE_NS && g->holder != (int)i;
        for (int k = 0; stale && k < g->nseg; k++)
            stale = g->seg[k].slice != (int)i;
        if (b->key && (!b->seen || stale))
            drop(g, (int)i, now);
    }
}

/* ---- credit ---- */

static void add_capped(int64_t *b, int64_t add, int64_t cap)
{
    int64_t next = *b + add;
    if (next > cap)
        next = *b > cap ? *b : cap;
    *b = next;
}

/* Earn share% (and floor%) of the wall time since the last refill. The cap applies
 * to credit net of what is charged but not settled yet (unsettled): a long hold
 * earns while it runs and pays at its end, and must not lose what it earned. */
static void refill(struct bslice *b, uint64_t now, int64_t unsettled)
{
    if (now <= b->credit_ts)
        return;
    uint64_t dt = now - b->credit_ts;
    b->credit_ts = now;
    if (dt > 10 * CREDIT_CAP_NS)
        dt = 10 * CREDIT_CAP_NS;
    add_capped(&b->credit, (int64_t)(dt * b->share / 100), (int64_t)CREDIT_CAP_NS + unsettled);
    if (b->floor)
        add_capped(&b->floor_credit, (int64_t)(dt * b->floor / 100), (int64_t)CREDIT_CAP_NS + unsettled);
}

static void charge(struct vg_bgpu *g, int i, uint64_t dt, int on_floor)
{
    struct bslice *b = &g->sl[i];
    int64_t lo = b->policy == VGPU_POLICY_BURST ? -(int64_t)DEBT_CAP_NS : -(int64_t)(10 * CREDIT_CAP_NS);
    b->credit -= (int64_t)dt;
    if (b->credit < lo)
        b->credit = lo;
    if (on_floor) {
        b->floor_credit -= (int64_t)dt;
        if (b->floor_credit < -(int64_t)DEBT_CAP_NS)
            b->floor_credit = -(int64_t)DEBT_CAP_NS;
    }
    b->used += dt;
}

/* ---- who goes next ---- */

struct standing {
    int eligible, on_floor, floor_due, credit;
    uint32_t prio;
    int64_t norm;
};

static int higher_active(const struct vg_bgpu *g, uint32_t prio, uint64_t now)
{
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        const struct bslice *b = &g->sl[i];
        if (b->key && b->prio > prio && now - b->last_active < ACTIVE_NS)
            return 1;
    }
    return 0;
}

/* The credit a fixed slice needs to take the token: enough for a worthwhile hold when
 * other slices use the GPU too, a little when it is alone on it (its CPU work between
 * steps then overlaps the time it earns credit in). */
static int64_t min_hold(const struct vg_bgpu *g)
{
    return g->active > 1 ? (int64_t)MIN_HOLD_NS : (int64_t)MIN_HOLD_ALONE_NS;
}

static struct standing standing_of(const struct vg_bgpu *g, const struct bslice *b, int64_t credit, uint64_t now)
{
    struct standing st = {0};
    st.prio = b->prio;
    st.credit = credit > 0;
    st.norm = credit * 100 / b->share;
    if (higher_active(g, b->prio, now)) {
        st.on_floor = 1;
        st.eligible = st.floor_due = b->floor && b->floor_credit >= (int64_t)MIN_HOLD_NS;
    } else if (b->policy == VGPU_POLICY_FIXED) {
        st.eligible = credit >= min_hold(g);
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

/* The best eligible waiter other than `self` (-1: none). */
static int best_waiter(const struct vg_bgpu *g, int self, uint64_t now, struct standing *out)
{
    int best = -1;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        const struct bslice *b = &g->sl[i];
        if ((int)i == self || !b->key || !b->waiting)
            continue;
        struct standing st = standing_of(g, b, b->credit, now);
        if (st.eligible && (best < 0 || better(&st, out))) {
            *out = st;
            best = (int)i;
        }
    }
    return best;
}

/* Idle time of the current hold that counts: claimed by the holder, in full for
 * the part of the hold in which nobody else waited, and at most a quarter of the
 * rest (the short sync gaps of a step loop that keeps the token through them:
 * a false claim gains at most that, and the out-of-band guard sees the rest). */
static uint64_t idle_allowed(const struct vg_bgpu *g, uint64_t now)
{
    const struct vgpu_sched_req *r = &g->sl[g->holder].req;
    uint64_t idle = 0;
    if (r->owner_seq == g->seq) {
        /* What it reported, and the empty spell it is in now (its end is not known yet). */
        uint64_t since = believed(r->idle_since, g->granted, now);
        idle = r->idle_ns + (since && since < now ? now - since : 0);
    }
    uint64_t span = now > g->granted ? now - g->granted : 0;
    uint64_t contended = span > g->uncontended ? span - g->uncontended : 0;
    uint64_t cap = g->uncontended + contended / CONTENDED_IDLE_DIV;
    return idle > cap ? cap : idle;
}

/* GPU time of the current hold so far (0 while its work waits behind another's). */
static uint64_t live_charge(const struct vg_bgpu *g, uint64_t now)
{
    const struct seg *c = &g->seg[g->nseg - 1];
    if (g->nseg != 1 || now <= c->start)
        return 0;
    uint64_t span = now - c->start, idle = idle_allowed(g, now);
    return span - (idle > span ? span : idle);
}

/* GPU time slice i ran in holds not settled yet, at most, as far as known now: a hold
 * queued behind another's unreported tail earns while it waits to be settled and must
 * not lose what it earned to the cap meanwhile. */
static uint64_t unsettled(const struct vg_bgpu *g, int i, uint64_t now)
{
    uint64_t sum = 0;
    for (int k = 0; k < g->nseg; k++) {
        const struct seg *c = &g->seg[k];
        if (c->slice != i)
            continue;
        if (!c->end) { /* the current hold */
            sum += k == 0 ? live_charge(g, now) : (now > c->granted ? now - c->granted : 0);
            continue;
        }
        uint64_t from = k == 0 && c->start ? c->start : c->granted;
        uint64_t end = c->end > from ? c->end : from;
        sum += (now > end ? now : end) - from;
    }
    return sum;
}

static void publish_grant(struct vg_bgpu *g, uint32_t v, uint64_t now)
{
    atomic_store(&g->s->grant_ns, now);
    atomic_store(&g->s->grant, v);
    futex(&g->s->grant, FUTEX_WAKE, INT_MAX, 0);
}

/* Settle segment 0, whose work ended at fin, and date the next one's start. */
static void settle(struct vg_bgpu *g, uint64_t fin)
{
    struct seg *s0 = &g->seg[0];
    if (fin < s0->start)
        fin = s0->start;
    uint64_t span = fin - s0->start;
    if (s0->slice >= 0)
        charge(g, s0->slice, span - (s0->idle > span ? span : s0->idle) + s0->penalty, s0->on_floor);
    memmove(&g->seg[0], &g->seg[1], (size_t)(g->nseg - 1) * sizeof(g->seg[0]));
    g->nseg--;
    if (g->nseg) {
        struct seg *n = &g->seg[0];
        n->start = fin > n->granted ? fin : n->granted;
    }
}

/* Latch each revoked hold's drain report the first time it is seen. A slice reports
 * only its latest drain, and a hold queued behind another's unsettled tail may wait
 * for it up to TAIL_MAX_NS: by then a later hold of its own may have reported over it,
 * and a slice that scrambles its reports would make its neighbours pay missing tails. */
static void note_drains(struct vg_bgpu *g, uint64_t now)
{
    for (int k = 0; k < g->nseg; k++) {
        struct seg *c = &g->seg[k];
        if (!c->end || !c->revoked || c->slice < 0 || c->drained)
            continue;
        const struct vgpu_sched_req *r = &g->sl[c->slice].req;
        /* A slice gives a hold back only with its queue empty: one that gave it back as we
         * took it (the two crossed) has nothing left to drain and reports no drain. */
        int drain = r->drain_seq == c->seq, release = r->release_seq == c->seq;
        if (drain || release) {
            c->drained = 1;
            c->drain_claim = drain ? r->drain_ns : r->release_ns;
            c->drain_seen = now;
        }
    }
}

/* When a revoked hold's tail began: its end, or its start if its work waited longer. */
static uint64_t tail_from(const struct seg *c)
{
    return c->start > c->end ? c->start : c->end;
}

/* Settle segment 0, a revoked hold whose drain was not reported, from `from` (when its
 * tail began), charging its slice `tail`: the holds after it are charged from their own
 * grants, not from behind what may be a made-up tail, and a drain it reports later pays
 * the rest of a real one. */
static void give_up_tail(struct vg_bgpu *g, uint64_t from, uint64_t tail)
{
    struct seg *s0 = &g->seg[0];
    s0->penalty = tail;
    g->sl[s0->slice].late_seq = s0->seq;
    g->sl[s0->slice].late_from = from + tail;
    settle(g, from);
}

/* Settle what can be: segments whose work is known to have ended. */
static void settle_ready(struct vg_bgpu *g, uint64_t now)
{
    note_drains(g, now);
    while (g->nseg) {
        struct seg *s0 = &g->seg[0];
        if (!s0->end)
            return; /* the current hold */
        uint64_t fin = 0;
        if (!s0->revoked || s0->slice < 0) {
            fin = s0->end; /* released drained, or revoked before any process took it */
        } else {
            uint64_t from = tail_from(s0);
            if (s0->drained) {
                fin = believed(s0->drain_claim, s0->start, s0->drain_seen);
                if (!fin)
                    fin = from; /* an impossible date: nothing was queued */
                else if (fin < s0->end)
                    fin = s0->end; /* it held the token until then */
            } else if (now >= from + TAIL_MAX_NS) {
                /* Never reported (a waiter that died, or a tenant that scrambles its
                 * reports): it pays the longest tail. */
                give_up_tail(g, from, TAIL_MAX_NS);
                continue;
            } else {
                return;
            }
        }
        settle(g, fin > now ? now : fin);
    }
}

static void end_hold(struct vg_bgpu *g, uint64_t end, uint64_t now, int revoked)
{
    if (g->holder < 0)
        return;
    struct seg *c = &g->seg[g->nseg - 1];
    c->end = end > c->granted ? end : c->granted;
    /* A grant no process took before we took it back left nothing queued. Taken is
     * latched the first time we see it (a taker rings us at once), so a tenant that
     * scrambles owner_seq afterwards cannot make its tail look like a grant nobody took. */
    c->revoked = revoked && (c->taken || g->sl[g->holder].req.owner_seq == g->seq);
    uint64_t idle = idle_allowed(g, end);
    c->idle = idle;
    g->holder = -1;
    if (revoked)
        atomic_fetch_add(&g->s->revocations, 1);
    publish_grant(g, 0, now);
    settle_ready(g, now);
}

/* Credit this close to the cap is lost while its slice waits (a step loop that cannot
 * spend it for the holder's credit-backed hold): such a waiter goes before a holder that
 * is not so close, or its share drains away into the cap. */
static int capped(int64_t credit)
{
    return credit >= (int64_t)(CREDIT_CAP_NS - CAP_MARGIN_NS);
}

static int should_revoke(struct vg_bgpu *g, uint64_t now)
{
    int h = g->holder;
    struct bslice *b = &g->sl[h];
    /* While an earlier hold's tail is unsettled our work's start is not known: count
     * the hold from its grant (our credit runs out no later than it would). */
    int64_t live = b->credit - (int64_t)(g->nseg == 1 ? live_charge(g, now) : now - g->granted);
    if (!g->seg[g->nseg - 1].taken && b->req.owner_seq != g->seq && now - g->granted >= TAKE_NS)
        return 1; /* nobody took it (a want that was a lie, or a waiter gone) */
    struct standing me = standing_of(g, b, live, now), other;
    if (me.on_floor && !g->on_floor)
        return 1; /* preempted by a higher priority */
    if (g->on_floor && b->floor_credit - (int64_t)live_charge(g, now) <= 0)
        return 1;
    if (b->policy == VGPU_POLICY_FIXED && live <= 0)
        return 1;
    int quantum = now - g->granted >= QUANTUM_NS;
    uint64_t beat = believed(b->req.active_ns, g->granted, now);
    if ((beat ? beat : g->granted) + LEASE_NS < now)
        return 1; /* its processes died or stopped: the lease lapsed */
    int w = best_waiter(g, h, now, &other);
    if (w >= 0 && better(&other, &me))
        return other.prio > me.prio || other.floor_due || !me.credit || quantum ||
               capped(g->sl[w].credit) > capped(live);
    /* Other processes of this slice take turns too. */
    return quantum && b->waiting;
}

static void grant(struct vg_bgpu *g, int i, uint64_t now)
{
    struct bslice *b = &g->sl[i];
    /* The epoch in the seq's top 4 bits: two brokers that overlap for a moment (an
     * election race, a stopped broker replaced) never publish the same grant word, so a
     * process that took one broker's grant cannot mistake another's for its own. */
    uint32_t count = (g->seq + 1) & 0xFFFFFu;
    g->seq = ((g->epoch & 0xFu) << 20) | (count ? count : 1);
    if (g->nseg == SEG_MAX) {
        /* The oldest, a tail not reported yet, makes room: charged its tail so far (had it
         * ended now, the holds after it would be charged only from now, their GPU time
         * before it lost: a tenant that never reports gave its neighbours free time). */
        struct seg *s0 = &g->seg[0];
        uint64_t from = tail_from(s0);
        if (s0->slice >= 0 && s0->revoked && !s0->drained)
            give_up_tail(g, from, now > from ? now - from : 0);
        else
            settle(g, from); /* (a gone slice's: nobody pays it) */
    }
    g->holder = i;
    g->granted = g->last_step = now;
    g->uncontended = 0;
    g->on_floor = standing_of(g, b, b->credit, now).on_floor;
    int k = g->nseg++;
    g->seg[k] = (struct seg){.slice = i, .on_floor = g->on_floor, .granted = now, .start = k ? 0 : now};
    g->seg[g->nseg - 1].seq = g->seq;
    b->holds++;
    atomic_fetch_add(&g->s->handoffs, 1);
    publish_grant(g, (g->seq << 8) | (uint32_t)(i + 1), now);
}

/* ---- one step ---- */

static uint64_t sig_of(const struct vgpu_sched_req *r)
{
    return ((uint64_t)r->want << 48) ^ ((uint64_t)r->release_seq << 24) ^ r->drain_seq ^
           ((uint64_t)r->owner_seq << 32);
}

static void read_all(struct vg_bgpu *g, uint64_t *sig)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        if (!b->key)
            continue;
        read_req(g, b);
        x = x * 1000003u + sig_of(&b->req) + i;
    }
    *sig = x;
}

static void publish(struct vg_bgpu *g, uint64_t now)
{
    struct vgpu_sched *s = g->s;
    uint32_t present[3] = {0, 0, 0}, mask = 0, contended = 0, active = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        if (!b->key)
            continue;
        struct vgpu_sched_entry *e = &s->entries[i];
        if (now - b->last_active < ACTIVE_NS) {
            mask |= 1u << b->prio;
            active++;
        }
        if (now - b->last_seen < PRESENT_NS)
            present[b->prio]++;
        if (b->waiting && (int)i != g->holder)
            contended = 1;
        atomic_store(&e->share, b->share);
        atomic_store(&e->priority, b->prio);
        atomic_store(&e->policy, b->policy);
        atomic_store(&e->floor, b->floor);
        atomic_store(&e->credit_ns, b->credit);
        atomic_store(&e->used_ns, b->used);
        atomic_store(&e->last_active_ns, b->last_active);
        atomic_store(&e->waiting, (uint32_t)b->waiting);
        atomic_store(&e->holds, b->holds);
    }
    for (int p = 0; p < 3; p++)
        atomic_store(&s->present[p], present[p]);
    atomic_store(&s->active_mask, mask);
    atomic_store(&s->contended, contended);
    atomic_store(&s->active, active);
    g->active = active;
    atomic_store(&s->broker_beat_ns, now);
}

/* Decide what changed since the last step; returns how long to sleep at most. */
static uint64_t step(struct vg_bgpu *g)
{
    uint64_t now = vg_broker_now();
    if (!g->priv && now - g->last_scan >= (g->rung ? RESCAN_RUNG_NS : RESCAN_NS))
        rescan(g, now);
    g->rung = 0;
    read_all(g, &g->sig);
    int others_wait = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        struct bslice *b = &g->sl[i];
        if (!b->key)
            continue;
        refill(b, now, (int64_t)unsettled(g, (int)i, now));
        const struct vgpu_sched_req *r = &b->req;
        b->waiting = r->want > 0 && r->want < (1u << 20) && believed(r->want_ns, now - ACTIVE_NS, now);
        /* Active: waiting, or renewing its lease or its 100% activity (a lapsed
         * holder is not: a dead high-priority slice must not hold the others back). */
        if (b->waiting || ((int)i == g->holder && now - g->granted < ACTIVE_NS))
            b->last_active = now;
        uint64_t seen = believed(r->want_ns, now - PRESENT_NS, now);
        uint64_t rep = believed(r->active_ns, now - PRESENT_NS, now);
        seen = rep > seen ? rep : seen;
        if (b->waiting || (int)i == g->holder)
            seen = now;
        if (seen > b->last_seen)
            b->last_seen = seen > now ? now : seen;
        uint64_t a = believed(r->active_ns, now - ACTIVE_NS, now);
        if (a > b->last_active)
            b->last_active = a > now ? now : a;
        if (b->waiting && (int)i != g->holder)
            others_wait = 1;
        if (b->late_seq && r->drain_seq == b->late_seq) {
            /* A tail longer than TAIL_MAX (one long launch) drained at last: its slice
             * pays the rest of it (a false date costs only itself). */
            uint64_t end = believed(r->drain_ns, b->late_from, now);
            if (end)
                charge(g, (int)i, end - b->late_from, 0);
            b->late_seq = 0;
        }
    }
    /* Holds before the current one: settled as their queued work reports its end. */
    settle_ready(g, now);
    if (g->holder >= 0) {
        if (!others_wait)
            g->uncontended += now - g->last_step;
        g->last_step = now;
        const struct vgpu_sched_req *r = &g->sl[g->holder].req;
        if (r->owner_seq == g->seq)
            g->seg[g->nseg - 1].taken = 1;
        if (r->release_seq == g->seq) {
            uint64_t lo = now > RELEASE_SLACK_NS ? now - RELEASE_SLACK_NS : 0;
            uint64_t end = believed(r->release_ns, lo > g->granted ? lo : g->granted, now);
            end_hold(g, end ? (end > now ? now : end) : now, now, 0);
        } else if (r->yield_seq == g->seq && best_waiter(g, g->holder, now, &(struct standing){0}) >= 0) {
            /* It syncs with its CPU work to follow: its tail runs out with the next
             * holder's work queued behind it (charged to it until it reports the drain). */
            end_hold(g, now, now, 1);
        } else if (should_revoke(g, now)) {
            end_hold(g, now, now, 1);
        }
    }
    if (g->holder < 0) {
        struct standing st;
        int next = best_waiter(g, -1, now, &st);
        if (next >= 0)
            grant(g, next, now);
    }
    publish(g, now);

    /* When to look again without being rung. */
    uint64_t sleep = BEAT_NS;
    if (g->nseg && g->seg[0].end && g->seg[0].revoked) {
        uint64_t from = tail_from(&g->seg[0]);
        uint64_t t = from + TAIL_MAX_NS > now ? from + TAIL_MAX_NS - now : 50 * US;
        if (t < sleep)
            sleep = t;
    }
    int waiters = 0;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++) {
        const struct bslice *b = &g->sl[i];
        if (!b->key || !b->waiting || (int)i == g->holder)
            continue;
        waiters = 1;
        if (b->policy == VGPU_POLICY_FIXED && b->credit < min_hold(g)) {
            uint64_t t = (uint64_t)(min_hold(g) - b->credit) * 100 / b->share;
            if (t < sleep)
                sleep = t;
        }
    }
    if (g->holder >= 0) {
        const struct bslice *b = &g->sl[g->holder];
        int64_t live = b->credit - (int64_t)(g->nseg == 1 ? live_charge(g, now) : now - g->granted);
        if (!g->seg[g->nseg - 1].taken && now - g->granted < TAKE_NS && TAKE_NS - (now - g->granted) < sleep)
            sleep = TAKE_NS - (now - g->granted); /* look again when an untaken grant lapses */
        if (b->policy == VGPU_POLICY_FIXED || g->on_floor) {
            uint64_t t = live > 0 ? (uint64_t)live : 0;
            if (t < sleep)
                sleep = t;
        }
        if (waiters && sleep > MS)
            sleep = MS; /* standings change as credit accrues */
    }
    return sleep < 20 * US ? 20 * US : sleep;
}

void vg_bgpu_run(struct vg_bgpu *g, volatile int *stop)
{
    atomic_store(&g->s->broker_pid, (uint32_t)getpid());
    /* A broker that was stopped (SIGSTOP) and replaced must not come back to it. */
    while (!*stop && atomic_load(&g->s->broker_epoch) == g->epoch) {
        uint64_t sleep = step(g);
        atomic_store(&g->s->doorbell, 1);
        uint64_t sig;
        read_all(g, &sig); /* a request made after the step and before the bell */
        if (sig == g->sig)
            g->rung = futex(&g->s->doorbell, FUTEX_WAIT, 1, sleep) == 0;
        atomic_store(&g->s->doorbell, 0);
    }
}

/* ---- setting up ---- */

static struct vg_bgpu *bgpu_new(struct vgpu_sched *s)
{
    struct vg_bgpu *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->s = s;
    g->holder = -1;
    /* Taken first: an older broker still running stops at its next step. */
    g->epoch = atomic_fetch_add(&s->broker_epoch, 1) + 1;
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        g->sl[i].fd = -1;
    /* Whatever a former broker left: a fresh start (slices re-request). */
    for (unsigned i = 0; i < VGPU_SCHED_ENTRIES; i++)
        atomic_store(&s->entries[i].key, 0);
    atomic_store(&s->grant, 0);
    futex(&s->grant, FUTEX_WAKE, INT_MAX, 0);
    return g;
}

struct vg_bgpu *vg_bgpu_open(const char *path, int confs, const char **why)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size >= sizeof(struct vgpu_sched))
        m = mmap(NULL, sizeof(struct vgpu_sched), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED || !vg_sched_header_ok(m)) {
        if (m != MAP_FAILED)
            munmap(m, sizeof(struct vgpu_sched));
        *why = "not a vgpu scheduling region of this version";
        return NULL;
    }
    struct vg_bgpu *g = bgpu_new(m);
    if (!g) {
        munmap(m, sizeof(struct vgpu_sched));
        *why = "out of memory";
        return NULL;
    }
    const char *slash = strrchr(path, '/');
    snprintf(g->dir, sizeof(g->dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    snprintf(g->uuid, sizeof(g->uuid), "%s", slash ? slash + 1 : path);
    g->confs = confs;
    rescan(g, vg_broker_now());
    return g;
}

struct vg_bgpu *vg_bgpu_private(struct vgpu_sched *s, struct vgpu_sched_req *req, uint64_t key)
{
    struct vg_bgpu *g = bgpu_new(s);
    if (!g)
        return NULL;
    g->priv = 1;
    g->sl[0].mem = req;
    take_on(g, 0, key, vg_broker_now());
    return g;
}
