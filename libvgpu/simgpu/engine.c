/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine.c - the timed engine (SIMGPU_TIMESLICE_US, SIMGPU_SWITCH_US,
 * SIMGPU_CONCURRENT_STREAMS): what runs when is worked out as time passes, since on a
 * time-sliced GPU a kernel's end depends on what other processes submit after it.
 *
 * Work waits in queues: one per stream with concurrent streams, else one per context
 * (simgpu keeps one context per process and device: its slot). A queue runs its entries
 * in order; an entry is a kernel or a wait for another queue's entry (cuStreamWaitEvent).
 * Contexts take the engine in turns. With a time slice, round robin among the contexts
 * that have a kernel ready: the owner runs until its slice ends (its kernels are then
 * preempted wherever they are, as compute preemption does, and resume in its next turn)
 * or it has nothing ready; with no other context waiting it just goes on. Without a
 * slice, first come first served: the context with the oldest ready kernel takes the
 * engine and runs its kernels that are older than every other context's, each to its
 * end. All the owner's ready queues run at once (concurrent streams overlap fully). The
 * engine loses SIMGPU_SWITCH_US whenever it passes to a context other than the last.
 *
 * The state of the simulation is a cursor: time, owner, phase and the queues. Whoever
 * takes the lock (a launch, a sync, a query, NVML) first runs it forward to the present.
 * A kernel's run leaves an interval {start, end, pid} in the device's ring, as the FIFO
 * engine's do; a run in progress is there with its end so far.
 *
 * Any process may be killed at any instruction, lock held. The lock is a robust
 * process-shared mutex, so the next locker gets it (EOWNERDEAD) and repairs. The cursor
 * is double-buffered: a change is made on the spare copy and committed by one atomic
 * store, so the committed cursor is always whole. Entries change in place, in an order
 * that the repair can finish from the committed cursor: an entry its queues reach is
 * queued, any other queued one is free; completions are deterministic, so running the
 * committed cursor forward again writes the same ends and intervals. Entries freed while
 * running forward are committed free before any is reused. A process stopped (SIGSTOP,
 * a cgroup freezer) inside the lock stalls the others' launches and syncs until it
 * resumes; NVML gives up on the lock after a few ms and answers from what was run.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "simgpu_state.h"

enum { E_FREE = 0, E_QUEUED = 1, E_DONE = 2 };
enum { P_IDLE = 0, P_SWITCH = 1, P_RUN = 2 };
enum { Q_FREE = 0, Q_OPEN = 1, Q_ORPHAN = 2 };

#define NONE UINT64_MAX
#define TOUCH_LOCK_NS 2000000ull  /* NVML waits at most this long for the lock */
#define STEPS_MAX 100000000u      /* a bound that a sane state never reaches */

struct eng {
    struct simgpu_state *st;
    struct simgpu_engine *E;
    struct simgpu_device *d;
    int dry; /* a prediction on a private cursor: entries, ring and slots untouched */
};

static int eng_get(unsigned dev, struct eng *g)
{
    struct simgpu_state *st = simgpu_state();
    if (!st || dev >= st->ndev)
        return -1;
    *g = (struct eng){.st = st, .E = &st->eng[dev], .d = &st->dev[dev], .dry = 0};
    return 0;
}

static uint32_t nq(const struct simgpu_cursor *c)
{
    return c->nq < SIMGPU_QUEUES ? c->nq : SIMGPU_QUEUES;
}

static struct simgpu_entry *ent(const struct eng *g, uint32_t i)
{
    return i < SIMGPU_ENTRIES ? &g->E->e[i] : NULL;
}

/* ---- the lock, the cursor and the repair ---- */

/* A locker that finds the last owner dead: entries reachable from the committed cursor's
 * queues are queued, other queued ones are free (a submit died before it committed). */
static void repair(struct eng *g)
{
    static const uint32_t words = SIMGPU_ENTRIES / 32;
    uint32_t reach[SIMGPU_ENTRIES / 32];
    memset(reach, 0, sizeof(reach));
    struct simgpu_cursor *c = &g->E->c[atomic_load(&g->E->cur) & 1];
    for (uint32_t k = 0; k < nq(c); k++) {
        struct simgpu_queue *q = &c->q[k];
        if (q->used == Q_FREE || q->head == SIMGPU_NIL)
            continue;
        uint32_t i = q->head;
        for (uint32_t n = 0; n < SIMGPU_ENTRIES && i < SIMGPU_ENTRIES; n++) {
            reach[i / 32] |= 1u << (i % 32);
            if (i == q->tail)
                break;
            i = g->E->e[i].next;
        }
    }
    for (uint32_t w = 0; w < words; w++) {
        for (uint32_t b = 0; b < 32; b++) {
            struct simgpu_entry *e = &g->E->e[w * 32 + b];
            if (reach[w] & (1u << b))
                atomic_store(&e->state, E_QUEUED);
            else if (atomic_load(&e->state) == E_QUEUED)
                atomic_store(&e->state, E_FREE);
        }
    }
    atomic_store(&g->d->ring_head, c->ring_head);
    atomic_fetch_add(&g->E->repairs, 1);
}

/* 0 with the lock held, -1 when it was not had within timeout_ns (0: wait for it). */
static int lock(struct eng *g, uint64_t timeout_ns)
{
    int rc;
    if (timeout_ns) {
        uint64_t t = simgpu_now_ns() + timeout_ns;
        struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
        rc = pthread_mutex_clocklock(&g->E->lock, CLOCK_MONOTONIC, &ts);
    } else {
        rc = pthread_mutex_lock(&g->E->lock);
    }
    if (rc == EOWNERDEAD) {
        repair(g);
        pthread_mutex_consistent(&g->E->lock);
        rc = 0;
    }
    return rc == 0 ? 0 : -1;
}

static void unlock(struct eng *g)
{
    pthread_mutex_unlock(&g->E->lock);
}

/* The spare cursor, a copy of the committed one, to change and commit. */
static struct simgpu_cursor *work(struct eng *g)
{
    uint32_t k = atomic_load(&g->E->cur) & 1;
    struct simgpu_cursor *from = &g->E->c[k], *to = &g->E->c[1 - k];
    memcpy(to, from, offsetof(struct simgpu_cursor, q) + nq(from) * sizeof(from->q[0]));
    return to;
}

/* No queued entry ends before this: now + the least a queued kernel has left. */
static uint64_t horizon(const struct simgpu_cursor *c)
{
    uint64_t h = NONE;
    for (uint32_t k = 0; k < nq(c); k++) {
        const struct simgpu_queue *q = &c->q[k];
        if (q->used != Q_FREE && q->head != SIMGPU_NIL && c->t + q->rem_ns < h)
            h = c->t + q->rem_ns;
    }
    return h;
}

static void commit(struct eng *g, struct simgpu_cursor *c)
{
    atomic_store(&g->E->cur, (uint32_t)(c - g->E->c));
    atomic_store(&g->d->ring_head, c->ring_head);
    atomic_store(&g->E->horizon, horizon(c));
}

/* ---- running the engine forward ---- */

static int is_wait(const struct simgpu_entry *e)
{
    return e->dep_q != SIMGPU_NIL;
}

/* The head kernel of queue k, or NULL (empty, free, or a wait at its head). */
static const struct simgpu_entry *ready(const struct eng *g, const struct simgpu_cursor *c, uint32_t k)
{
    const struct simgpu_queue *q = &c->q[k];
    if (q->used == Q_FREE || q->head == SIMGPU_NIL)
        return NULL;
    const struct simgpu_entry *e = ent(g, q->head);
    return e && !is_wait(e) ? e : NULL;
}

static void piece_end(const struct eng *g, struct simgpu_queue *q, uint64_t t)
{
    if (!g->dry && q->piece != NONE)
        atomic_store(&g->d->ring[q->piece % SIMGPU_RING].end_ns, t);
}

static void piece_open(const struct eng *g, struct simgpu_cursor *c, struct simgpu_queue *q)
{
    q->piece = c->ring_head++;
    if (g->dry)
        return;
    struct simgpu_interval *iv = &g->d->ring[q->piece % SIMGPU_RING];
    atomic_store(&iv->end_ns, 0); /* end <= start: readers skip it until it has one */
    atomic_store(&iv->start_ns, c->t);
    atomic_store(&iv->pid, q->pid);
    atomic_store(&iv->end_ns, c->t);
}

/* The head of queue k is done at c->t. */
static void complete(const struct eng *g, struct simgpu_cursor *c, uint32_t k)
{
    struct simgpu_queue *q = &c->q[k];
    struct simgpu_entry *e = ent(g, q->head);
    piece_end(g, q, c->t);
    q->piece = NONE;
    if (!e) { /* a broken chain: drop the queue's work */
        q->head = q->tail = SIMGPU_NIL;
        return;
    }
    if (!g->dry) {
        atomic_store(&e->done_ns, c->t);
        atomic_store(&e->state, e->refs ? E_DONE : E_FREE);
    }
    q->done_seq = atomic_load(&e->seq);
    if (q->head == q->tail) {
        q->head = q->tail = SIMGPU_NIL;
        q->rem_ns = 0;
        if (q->used == Q_ORPHAN)
            q->used = Q_FREE;
    } else {
        q->head = e->next;
        const struct simgpu_entry *n = ent(g, q->head);
        q->rem_ns = n ? n->dur_ns : 0;
    }
}

/* Heads that are waits for work already done end now; repeat, since each such end may
 * be what another wait waits for. */
static void complete_waits(const struct eng *g, struct simgpu_cursor *c)
{
    for (int again = 1; again;) {
        again = 0;
        for (uint32_t k = 0; k < nq(c); k++) {
            const struct simgpu_queue *q = &c->q[k];
            if (q->used == Q_FREE || q->head == SIMGPU_NIL)
                continue;
            const struct simgpu_entry *e = ent(g, q->head);
            if (e && is_wait(e) && (e->dep_q >= SIMGPU_QUEUES || c->q[e->dep_q].done_seq >= e->dep_seq)) {
                complete(g, c, k);
                again = 1;
            }
        }
    }
}

/* The next context to take the engine, -1 for none. Round robin: the first with a ready
 * kernel after `after` (cyclic over slots), `after` itself only when include_after.
 * Otherwise: the one with the oldest ready kernel. */
static int pick(const struct eng *g, const struct simgpu_cursor *c, int after, int include_after)
{
    int best = -1;
    uint64_t best_key = NONE;
    for (uint32_t k = 0; k < nq(c); k++) {
        const struct simgpu_entry *e = ready(g, c, k);
        uint32_t ctx = c->q[k].ctx % SIMGPU_SLOTS;
        if (!e)
            continue;
        uint64_t key;
        if (g->st->cfg.slice_ns) {
            if ((int)ctx == after && !include_after)
                continue;
            uint32_t start = after < 0 ? 0 : (uint32_t)(after + 1) % SIMGPU_SLOTS;
            key = (ctx + SIMGPU_SLOTS - start) % SIMGPU_SLOTS; /* `after` itself comes last */
        } else {
            key = atomic_load(&e->seq);
        }
        if (key < best_key) {
            best_key = key;
            best = (int)ctx;
        }
    }
    return best;
}

static void take(const struct eng *g, struct simgpu_cursor *c, int ctx)
{
    c->owner = ctx;
    if (g->st->cfg.switch_ns && c->last >= 0 && ctx != c->last) {
        c->phase = P_SWITCH;
        c->phase_end = c->t + g->st->cfg.switch_ns;
        return;
    }
    c->phase = P_RUN;
    c->last = ctx;
    c->phase_end = g->st->cfg.slice_ns ? c->t + g->st->cfg.slice_ns : NONE;
}

/* The owner's queues that run now, into run[]; returns how many. */
static uint32_t running(const struct eng *g, const struct simgpu_cursor *c, uint32_t *run)
{
    uint64_t others = NONE; /* first come first served: the oldest ready kernel of another */
    if (!g->st->cfg.slice_ns) {
        for (uint32_t k = 0; k < nq(c); k++) {
            const struct simgpu_entry *e = ready(g, c, k);
            if (e && (int)c->q[k].ctx != c->owner && atomic_load(&e->seq) < others)
                others = atomic_load(&e->seq);
        }
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < nq(c); k++) {
        const struct simgpu_entry *e = ready(g, c, k);
        if (!e || (int)c->q[k].ctx != c->owner)
            continue;
        if (g->st->cfg.slice_ns || c->q[k].piece != NONE || atomic_load(&e->seq) < others)
            run[n++] = k;
    }
    return n;
}

static int all_done(const struct simgpu_cursor *c, const struct simgpu_ticket *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (t[i].seq && t[i].q < SIMGPU_QUEUES && c->q[t[i].q].done_seq < t[i].seq)
            return 0;
    return 1;
}

/* Run c forward to `to`; with targets (a prediction), stop as soon as they are all done
 * and return when, else return c->t. */
static uint64_t run_to(const struct eng *g, struct simgpu_cursor *c, uint64_t to, const struct simgpu_ticket *tk,
                       unsigned ntk)
{
    const uint64_t slice = g->st->cfg.slice_ns;
    uint32_t run[SIMGPU_QUEUES];
    for (uint32_t steps = 0; steps < STEPS_MAX; steps++) {
        complete_waits(g, c);
        if (tk && all_done(c, tk, ntk))
            return c->t;
        if (c->phase == P_SWITCH) {
            if (c->phase_end > to) {
                c->t = to > c->t ? to : c->t;
                return c->t;
            }
            c->t = c->phase_end;
            c->phase = P_RUN;
            c->last = c->owner;
            c->phase_end = slice ? c->t + slice : NONE;
            continue;
        }
        if (c->phase == P_RUN) {
            if (slice && c->t >= c->phase_end) {
                int next = pick(g, c, c->owner, 0);
                if (next >= 0) { /* the slice is over and another waits: preempt */
                    for (uint32_t k = 0; k < nq(c); k++) {
                        if ((int)c->q[k].ctx == c->owner && c->q[k].piece != NONE) {
                            piece_end(g, &c->q[k], c->t);
                            c->q[k].piece = NONE;
                        }
                    }
                    take(g, c, next);
                    continue;
                }
                c->phase_end = c->t + slice;
            }
            uint32_t n = running(g, c, run);
            if (n == 0) {
                c->phase = P_IDLE;
                c->owner = -1;
                continue;
            }
            uint64_t dt = NONE;
            for (uint32_t i = 0; i < n; i++) {
                struct simgpu_queue *q = &c->q[run[i]];
                /* a run older than half the ring would soon be overwritten: go on in a new one */
                if (q->piece != NONE && c->ring_head - q->piece >= SIMGPU_RING / 2)
                    q->piece = NONE;
                if (q->piece == NONE)
                    piece_open(g, c, q);
                if (q->rem_ns < dt)
                    dt = q->rem_ns;
            }
            if (slice && c->phase_end - c->t < dt)
                dt = c->phase_end - c->t;
            int stop = to <= c->t || to - c->t < dt;
            if (stop)
                dt = to > c->t ? to - c->t : 0;
            c->t += dt;
            for (uint32_t i = 0; i < n; i++) {
                struct simgpu_queue *q = &c->q[run[i]];
                q->rem_ns -= dt;
                piece_end(g, q, c->t);
            }
            if (!g->dry && c->owner >= 0 && (uint32_t)c->owner < SIMGPU_SLOTS)
                atomic_store(&g->d->slots[c->owner].last_active_ns, c->t);
            for (uint32_t i = 0; i < n; i++)
                if (c->q[run[i]].rem_ns == 0)
                    complete(g, c, run[i]);
            if (stop)
                return c->t;
            continue;
        }
        int next = pick(g, c, c->last, 1);
        if (next < 0) {
            c->phase = P_IDLE;
            c->t = to > c->t ? to : c->t;
            return c->t;
        }
        take(g, c, next);
    }
    return c->t;
}

/* SIMGPU_TEST_CRASH=advance:N or submit:N (simgpu's own tests): the process dies at the
 * N-th such step, lock held, its changes in place and not committed. */
static void crash_point(const char *step)
{
    static _Atomic long left[2] = {-1, -1};
    int k = step[0] == 's';
    if (atomic_load(&left[k]) == -1) {
        const char *v = getenv("SIMGPU_TEST_CRASH");
        size_t n = strlen(step);
        long at = v && !strncmp(v, step, n) && v[n] == ':' ? atol(v + n + 1) : 0;
        atomic_store(&left[k], at > 0 ? at : 0);
    }
    if (atomic_load(&left[k]) > 0 && atomic_fetch_sub(&left[k], 1) == 1)
        _exit(3);
}

/* Run the committed cursor forward to now and commit: the start of every look. */
static struct simgpu_cursor *advance(struct eng *g)
{
    struct simgpu_cursor *c = work(g);
    run_to(g, c, simgpu_now_ns(), NULL, 0);
    crash_point("advance");
    commit(g, c);
    return c;
}

/* When the tickets' work will be done if nothing else is submitted (lock held). */
static uint64_t predict(struct eng *g, const struct simgpu_ticket *t, unsigned n)
{
    struct simgpu_cursor *c = malloc(sizeof(*c));
    if (!c)
        return simgpu_now_ns() + 1000000ull;
    const struct simgpu_cursor *from = &g->E->c[atomic_load(&g->E->cur) & 1];
    memcpy(c, from, offsetof(struct simgpu_cursor, q) + nq(from) * sizeof(from->q[0]));
    struct eng dry = *g;
    dry.dry = 1;
    uint64_t at = run_to(&dry, c, NONE, t, n);
    free(c);
    return at;
}

/* ---- owners ---- */

static int owner_alive(const struct eng *g, uint32_t ctx, uint32_t pid)
{
    if (ctx >= SIMGPU_SLOTS)
        return 0;
    struct vg_slot *s = &g->d->slots[ctx];
    if (atomic_load(&s->pid) != pid)
        return 0;
    return vg_pid_alive(pid, atomic_load(&s->start_time), atomic_load(&s->pid_ns));
}

/* Entries kept for the events of processes that are gone, and queues of theirs with no
 * work left, are free again. */
static void reclaim(struct eng *g, struct simgpu_cursor *c)
{
    for (uint32_t i = 0; i < SIMGPU_ENTRIES; i++) {
        struct simgpu_entry *e = &g->E->e[i];
        if (atomic_load(&e->state) == E_DONE && !owner_alive(g, e->ctx, e->pid))
            atomic_store(&e->state, E_FREE);
    }
    for (uint32_t k = 0; k < nq(c); k++) {
        struct simgpu_queue *q = &c->q[k];
        if (q->used != Q_FREE && q->head == SIMGPU_NIL && !owner_alive(g, q->ctx, q->pid))
            q->used = Q_FREE;
    }
    while (c->nq > 0 && c->q[c->nq - 1].used == Q_FREE)
        c->nq--;
}

static uint32_t find_entry(struct eng *g, struct simgpu_cursor *c)
{
    for (uint32_t n = 0; n < SIMGPU_ENTRIES; n++) {
        uint32_t i = (c->hint + n) % SIMGPU_ENTRIES;
        if (atomic_load(&g->E->e[i].state) == E_FREE) {
            c->hint = (i + 1) % SIMGPU_ENTRIES;
            return i;
        }
    }
    return SIMGPU_NIL;
}

/* ---- the API (simgpu_state.h) ---- */

int simgpu_queue_open(unsigned dev, uint32_t *out)
{
    struct eng g;
    int ctx = simgpu_slot(dev);
    if (eng_get(dev, &g) != 0 || ctx < 0 || lock(&g, 0) != 0)
        return -1;
    advance(&g);
    struct simgpu_cursor *c = work(&g);
    uint32_t k = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (k = 0; k < nq(c) && c->q[k].used != Q_FREE; k++)
            ;
        if (k < SIMGPU_QUEUES || pass)
            break;
        reclaim(&g, c);
    }
    int rc = -1;
    if (k < SIMGPU_QUEUES) {
        c->q[k] = (struct simgpu_queue){.used = Q_OPEN,
                                        .ctx = (uint32_t)ctx,
                                        .pid = (uint32_t)getpid(),
                                        .head = SIMGPU_NIL,
                                        .tail = SIMGPU_NIL,
                                        .piece = NONE,
                                        .done_seq = c->seq};
        if (k >= c->nq)
            c->nq = k + 1;
        *out = k;
        rc = 0;
    }
    commit(&g, c);
    unlock(&g);
    return rc;
}

void simgpu_queue_close(unsigned dev, uint32_t k)
{
    struct eng g;
    if (k >= SIMGPU_QUEUES || eng_get(dev, &g) != 0 || lock(&g, 0) != 0)
        return;
    advance(&g);
    struct simgpu_cursor *c = work(&g);
    struct simgpu_queue *q = &c->q[k];
    if (q->used == Q_OPEN && q->pid == (uint32_t)getpid())
        q->used = q->head == SIMGPU_NIL ? Q_FREE : Q_ORPHAN;
    while (c->nq > 0 && c->q[c->nq - 1].used == Q_FREE)
        c->nq--;
    commit(&g, c);
    unlock(&g);
}

int simgpu_queue_submit(unsigned dev, uint32_t k, uint64_t dur_ns, const struct simgpu_ticket *dep,
                        struct simgpu_ticket *out)
{
    struct eng g;
    if (k >= SIMGPU_QUEUES || eng_get(dev, &g) != 0)
        return -1;
    for (;;) {
        if (lock(&g, 0) != 0)
            return -1;
        advance(&g); /* committed: entries it freed are free for this submit */
        struct simgpu_cursor *c = work(&g);
        struct simgpu_queue *q = &c->q[k];
        if (k >= nq(c) || q->used != Q_OPEN || q->pid != (uint32_t)getpid()) {
            unlock(&g);
            return -1;
        }
        uint32_t i = find_entry(&g, c);
        if (i == SIMGPU_NIL) {
            reclaim(&g, c);
            i = find_entry(&g, c);
        }
        if (i == SIMGPU_NIL) {
            /* All queued: wait for some to end, as a launch into a full push buffer does. */
            commit(&g, c);
            unlock(&g);
            uint64_t h = atomic_load(&g.E->horizon), now = simgpu_now_ns();
            simgpu_wait_raw(h > now && h - now < 10000000ull ? h : now + 100000ull, SIMGPU_SLEEP);
            continue;
        }
        struct simgpu_entry *e = &g.E->e[i];
        e->refs = 0;
        e->next = SIMGPU_NIL;
        e->pid = q->pid;
        e->ctx = q->ctx;
        e->dep_q = dep ? dep->q : SIMGPU_NIL;
        e->dep_seq = dep ? dep->seq : 0;
        e->dur_ns = dep ? 0 : dur_ns;
        atomic_store(&e->done_ns, 0);
        atomic_store(&e->seq, ++c->seq);
        atomic_store(&e->state, E_QUEUED);
        if (q->head == SIMGPU_NIL) {
            q->head = i;
            q->rem_ns = e->dur_ns;
            q->piece = NONE;
        } else {
            g.E->e[q->tail].next = i; /* past the committed tail: unseen until the commit */
        }
        q->tail = i;
        crash_point("submit");
        commit(&g, c);
        if (q->ctx < SIMGPU_SLOTS && !dep) {
            atomic_fetch_add(&g.d->slots[q->ctx].busy_ns, dur_ns);
            atomic_store(&g.d->slots[q->ctx].last_active_ns, c->t);
        }
        if (!dep)
            atomic_fetch_add(&g.d->busy_total_ns, dur_ns);
        *out = (struct simgpu_ticket){.t_ns = 0, .seq = c->seq, .q = k, .idx = i};
        unlock(&g);
        return 0;
    }
}

static int ticket_done(const struct simgpu_cursor *c, const struct simgpu_ticket *t)
{
    return !t->seq || t->q >= SIMGPU_QUEUES || c->q[t->q].done_seq >= t->seq;
}

void simgpu_ticket_mark(unsigned dev, const struct simgpu_ticket *last, struct simgpu_ticket *ev)
{
    struct eng g;
    *ev = (struct simgpu_ticket){0};
    if (eng_get(dev, &g) != 0 || lock(&g, 0) != 0) {
        ev->t_ns = simgpu_now_ns();
        return;
    }
    struct simgpu_cursor *c = advance(&g);
    struct simgpu_entry *e = ent(&g, last->idx);
    if (ticket_done(c, last) || !e || atomic_load(&e->seq) != last->seq) {
        ev->t_ns = c->t; /* the stream is idle: the event completes as it is recorded */
    } else {
        e->refs++;
        *ev = *last;
        ev->t_ns = 0;
    }
    unlock(&g);
}

int simgpu_engine_others_queued(unsigned dev, uint32_t k)
{
    struct eng g;
    if (k >= SIMGPU_QUEUES || eng_get(dev, &g) != 0 || lock(&g, 0) != 0)
        return 0;
    struct simgpu_cursor *c = advance(&g);
    int others = 0;
    for (uint32_t i = 0; i < nq(c) && !others; i++)
        others = c->q[i].used != Q_FREE && c->q[i].ctx != c->q[k].ctx && c->q[i].head != SIMGPU_NIL;
    unlock(&g);
    return others;
}

/* A hold is given back: the entry is free once done and held by nothing. */
static void drop(struct eng *g, const struct simgpu_ticket *t)
{
    struct simgpu_entry *e = ent(g, t->idx);
    if (!e || atomic_load(&e->seq) != t->seq || e->refs == 0)
        return;
    if (--e->refs == 0 && atomic_load(&e->state) == E_DONE)
        atomic_store(&e->state, E_FREE);
}

/* Certainly not done yet, known without the lock: the entry is still queued and the
 * engine's horizon (read first) is ahead of now. */
static int surely_pending(const struct eng *g, const struct simgpu_ticket *t)
{
    uint64_t h = atomic_load(&g->E->horizon);
    const struct simgpu_entry *e = ent(g, t->idx);
    return e && atomic_load(&e->seq) == t->seq && atomic_load(&e->state) == E_QUEUED && simgpu_now_ns() < h;
}

int simgpu_ticket_resolve(unsigned dev, struct simgpu_ticket *t)
{
    struct eng g;
    if (t->t_ns || !t->seq)
        return 1;
    if (eng_get(dev, &g) != 0)
        return 1;
    if (surely_pending(&g, t))
        return 0;
    if (lock(&g, 0) != 0)
        return 0;
    struct simgpu_cursor *c = advance(&g);
    int done = ticket_done(c, t);
    if (done) {
        struct simgpu_entry *e = ent(&g, t->idx);
        t->t_ns = e && atomic_load(&e->seq) == t->seq ? atomic_load(&e->done_ns) : c->t;
        if (!t->t_ns)
            t->t_ns = c->t;
        drop(&g, t);
    }
    unlock(&g);
    return done;
}

void simgpu_ticket_release(unsigned dev, struct simgpu_ticket *t)
{
    struct eng g;
    if (!t->t_ns && t->seq && eng_get(dev, &g) == 0 && lock(&g, 0) == 0) {
        drop(&g, t);
        unlock(&g);
    }
    *t = (struct simgpu_ticket){0};
}

/* 1 when done (*end: when the last ended, 0 when no longer known); else 0 with *pred the
 * predicted end (when pred is not NULL). */
static int check(struct eng *g, const struct simgpu_ticket *t, unsigned n, uint64_t *end, uint64_t *pred)
{
    if (n == 1 && surely_pending(g, t) && !pred)
        return 0;
    if (lock(g, 0) != 0)
        return 0;
    struct simgpu_cursor *c = advance(g);
    int done = all_done(c, t, n);
    if (done) {
        *end = 0;
        for (unsigned i = 0; i < n; i++) {
            const struct simgpu_entry *e = ent(g, t[i].idx);
            /* an entry is reused only after all others were: seq tells */
            uint64_t at = e && atomic_load(&e->seq) == t[i].seq ? atomic_load(&e->done_ns) : 0;
            if (at > *end)
                *end = at;
        }
    } else if (pred) {
        *pred = predict(g, t, n);
    }
    unlock(g);
    return done;
}

int simgpu_tickets_done(unsigned dev, const struct simgpu_ticket *t, unsigned n, uint64_t *end_ns)
{
    struct eng g;
    if (eng_get(dev, &g) != 0)
        return 1;
    return check(&g, t, n, end_ns, NULL);
}

void simgpu_tickets_wait(unsigned dev, struct simgpu_ticket *t, unsigned n, uint64_t called_ns,
                         enum simgpu_how how)
{
    struct eng g;
    uint64_t end = 0, pred = 0;
    if (eng_get(dev, &g) != 0)
        return;
    while (!check(&g, t, n, &end, &pred)) {
        /* Others' later work can only make it later: wait for the prediction, look again
         * (every 10 ms at most, in case nothing in sight ends it). */
        uint64_t cap = simgpu_now_ns() + 10000000ull;
        simgpu_wait_raw(pred < cap ? pred : cap, how);
    }
    simgpu_wait_for(end, called_ns, how);
}

unsigned simgpu_process_tails(unsigned dev, struct simgpu_ticket *t, unsigned max)
{
    struct eng g;
    if (eng_get(dev, &g) != 0 || lock(&g, 0) != 0)
        return 0;
    struct simgpu_cursor *c = advance(&g);
    unsigned n = 0;
    uint32_t pid = (uint32_t)getpid();
    for (uint32_t k = 0; k < nq(c) && n < max; k++) {
        const struct simgpu_queue *q = &c->q[k];
        const struct simgpu_entry *e = ent(&g, q->tail);
        if (q->used != Q_FREE && q->pid == pid && q->head != SIMGPU_NIL && e)
            t[n++] = (struct simgpu_ticket){.seq = atomic_load(&e->seq), .q = k, .idx = q->tail};
    }
    unlock(&g);
    return n;
}

void simgpu_engine_touch(unsigned dev)
{
    struct eng g;
    if (eng_get(dev, &g) != 0 || !g.st->cfg.timed || lock(&g, TOUCH_LOCK_NS) != 0)
        return;
    advance(&g);
    unlock(&g);
}
