/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_stream.c - streams and events on the simulated engine timeline.
 *
 * The FIFO engine (the default) runs kernels from every process one at a time in
 * submission order (simgpu_engine_submit), so a stream only needs to remember when
 * its last kernel ends: work is never reordered, synchronising is a wait until that
 * time, and an event records the time at which the stream's queued work ends (or now,
 * when the stream is idle).
 *
 * On the timed engine (engine.c) an end is known only once the engine got there: a
 * stream remembers its last work as a ticket, syncs wait for tickets, and an event
 * holds its stream's last entry until it is found done, then keeps its time.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"

struct sg_event {
    uint32_t magic;
    unsigned flags;
    _Atomic uint64_t t_ns;   /* when the recorded work completes(d); 0: never recorded, or
                              * on the timed engine not yet known */
    _Atomic uint64_t cap_id; /* the capture it was last recorded into, 0: none */
    pthread_mutex_t lock;    /* timed engine: guards dev, tk */
    unsigned dev;            /* the device of tk */
    struct simgpu_ticket tk; /* the work it completes with, while that is pending (seq 0: none) */
};

static int timed(void)
{
    return sg_state()->cfg.timed;
}

/* Without concurrent streams the timed engine has one queue per process and device (its
 * context): every stream of the process goes into it, in order. */
static uint32_t g_pq[SIMGPU_MAX_DEVICES];
static pid_t g_pq_pid;
static pthread_mutex_t g_pq_lock = PTHREAD_MUTEX_INITIALIZER;

/* s's queue on the timed engine (s->lock held): 0, or -1 when none is free. */
static int stream_queue(struct sg_stream *s, unsigned dev, uint32_t *q)
{
    if (sg_state()->cfg.concurrent) {
        if (s->q == SIMGPU_NIL && simgpu_queue_open(dev, &s->q) != 0)
            return -1;
        *q = s->q;
        return 0;
    }
    int rc = 0;
    pthread_mutex_lock(&g_pq_lock);
    if (g_pq_pid != getpid()) { /* none yet, or a fork's child: the parent's are not ours */
        for (unsigned i = 0; i < SIMGPU_MAX_DEVICES; i++)
            g_pq[i] = SIMGPU_NIL;
        g_pq_pid = getpid();
    }
    if (g_pq[dev] == SIMGPU_NIL && simgpu_queue_open(dev, &g_pq[dev]) != 0)
        rc = -1;
    *q = g_pq[dev];
    pthread_mutex_unlock(&g_pq_lock);
    return rc;
}

static unsigned stream_dev(const struct sg_stream *s)
{
    return sg_phys(s->ctx->dev);
}

static struct simgpu_ticket stream_last(struct sg_stream *s)
{
    pthread_mutex_lock(&s->lock);
    struct simgpu_ticket t = s->last;
    pthread_mutex_unlock(&s->lock);
    return t;
}

static void atomic_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

void sg_stream_init(struct sg_stream *s, struct sg_ctx *ctx, unsigned flags)
{
    s->magic = SG_MAGIC_STREAM;
    s->ctx = ctx;
    s->flags = flags;
    atomic_store(&s->last_end, 0);
    pthread_mutex_init(&s->lock, NULL);
    s->capture = NULL;
    s->cap_next = NULL;
    s->q = SIMGPU_NIL;
    memset(&s->last, 0, sizeof(s->last));
}

CUresult sg_stream_resolve(CUstream h, struct sg_stream **out)
{
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct sg_ctx *c;
        CUresult rc = sg_current_ctx(&c);
        if (rc != CUDA_SUCCESS)
            return rc;
        *out = &c->null_stream;
        return CUDA_SUCCESS;
    }
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_stream *s = (struct sg_stream *)h;
    if (!sg_handle_ok(s, SG_MAGIC_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->ctx->magic != SG_MAGIC_CTX)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s;
    return CUDA_SUCCESS;
}

void sg_stream_note_end(struct sg_stream *s, uint64_t end_ns)
{
    atomic_max(&s->last_end, end_ns);
    atomic_max(&s->ctx->last_end, end_ns);
}

CUresult sg_stream_submit(struct sg_stream *s, uint64_t dur_ns)
{
    CUresult rc = CUDA_SUCCESS;
    if (sg_capture_add(s, dur_ns, &rc))
        return rc;
    /* Submitting under the stream lock keeps one stream's kernels in order on
     * the engine even when several threads launch into it. */
    pthread_mutex_lock(&s->lock);
    if (timed()) {
        uint32_t q;
        struct simgpu_ticket t;
        if (stream_queue(s, stream_dev(s), &q) != 0 || simgpu_queue_submit(stream_dev(s), q, dur_ns, NULL, &t) != 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            s->last = t;
    } else {
        sg_stream_note_end(s, simgpu_engine_submit(stream_dev(s), dur_ns));
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void sg_ctx_wait(struct sg_ctx *c)
{
    uint64_t called = simgpu_now_ns();
    if (!timed()) {
        simgpu_wait_for(atomic_load(&c->last_end), called, SIMGPU_YIELD);
        return;
    }
    /* simgpu keeps one context per process and device: its work is the process's there */
    struct simgpu_ticket t[SIMGPU_QUEUES];
    unsigned dev = sg_phys(c->dev);
    unsigned n = simgpu_process_tails(dev, t, SIMGPU_QUEUES);
    simgpu_tickets_wait(dev, t, n, called, SIMGPU_YIELD);
}

static CUresult stream_create(CUstream *phStream, unsigned int flags)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sg_stream_init(s, c, flags);
    if (sg_handle_add(s) != 0) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return stream_create(phStream, Flags);
}

/* Priorities have no effect on a single FIFO engine. */
SIMGPU_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    (void)priority;
    return stream_create(phStream, flags);
}

SIMGPU_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_stream *s = (struct sg_stream *)hStream;
    /* Queued work still completes on the engine; nothing waits for it here. */
    if (!s || !sg_handle_take(s, SG_MAGIC_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    sg_capture_drop(s);
    if (s->q != SIMGPU_NIL)
        simgpu_queue_close(stream_dev(s), s->q);
    s->magic = SG_MAGIC_DEAD;
    pthread_mutex_destroy(&s->lock);
    free(s);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

SIMGPU_API CUresult cuStreamSynchronize(CUstream hStream)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(s, NULL, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t called = simgpu_now_ns();
    if (timed()) {
        struct simgpu_ticket t = stream_last(s);
        simgpu_tickets_wait(stream_dev(s), &t, 1, called, SIMGPU_YIELD);
    } else {
        simgpu_wait_for(atomic_load(&s->last_end), called, SIMGPU_YIELD);
    }
    sg_pool_sync();
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamQuery(CUstream hStream)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(s, NULL, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (timed()) {
        struct simgpu_ticket t = stream_last(s);
        uint64_t end;
        return simgpu_tickets_done(stream_dev(s), &t, 1, &end) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    return simgpu_now_ns() >= atomic_load(&s->last_end) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIMGPU_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)s->ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    if (!pCtx || !pGreenCtx)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuStreamGetCtx(hStream, pCtx);
    if (rc == CUDA_SUCCESS)
        *pGreenCtx = NULL; /* simgpu has no green contexts */
    return rc;
}

SIMGPU_API CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    return cuStreamGetCtx(hStream, pctx);
}

SIMGPU_API CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    return cuStreamGetCtx_v2(hStream, pCtx, pGreenCtx);
}

/* On the FIFO engine, work queued after the event already runs after it: waiting needs
 * no more than carrying the event's time into the stream. On the timed one, a wait is
 * queued when the event is pending on another queue of the device (its own queue runs in
 * order anyway; a wait across devices is not simulated). */
SIMGPU_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_event *e = (struct sg_event *)hEvent;
    if (!e || !sg_handle_ok(e, SG_MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if (Flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    if (sg_capture_id(s, NULL))
        return CUDA_SUCCESS;
    if (!timed()) {
        sg_stream_note_end(s, atomic_load(&e->t_ns));
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&e->lock);
    struct simgpu_ticket dep = e->tk;
    unsigned edev = e->dev;
    pthread_mutex_unlock(&e->lock);
    if (!dep.seq || edev != stream_dev(s))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&s->lock);
    uint32_t q;
    struct simgpu_ticket t;
    if (stream_queue(s, edev, &q) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (dep.q != q && simgpu_queue_submit(edev, q, 0, &dep, &t) == 0)
        s->last = t;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- events ---- */

SIMGPU_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phEvent || (Flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_event *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SG_MAGIC_EVENT;
    e->flags = Flags;
    pthread_mutex_init(&e->lock, NULL);
    if (sg_handle_add(e) != 0) {
        pthread_mutex_destroy(&e->lock);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_event *e = (struct sg_event *)hEvent;
    if (!e || !sg_handle_ok(e, SG_MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    struct sg_stream *s;
    if ((rc = sg_stream_resolve(hStream, &s)) != CUDA_SUCCESS)
        return rc;
    /* During capture an event record is an ordering point inside the graph (simgpu
     * graphs are linear, so there is nothing to add), and the event is the capture's. */
    int invalid;
    uint64_t cap = sg_capture_id(s, &invalid);
    if (invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    atomic_store(&e->cap_id, cap);
    if (cap)
        return CUDA_SUCCESS;
    if (timed()) {
        /* stream, then event, then the engine: the order every path takes them in */
        pthread_mutex_lock(&s->lock);
        pthread_mutex_lock(&e->lock);
        simgpu_ticket_release(e->dev, &e->tk);
        e->dev = stream_dev(s);
        /* An idle stream's record is work of its context like any other: while another
         * context has work on the engine, it completes when this one gets the engine (a
         * time-sliced GPU's next turn, or after the older work first come first served). */
        uint32_t q;
        struct simgpu_ticket last = s->last, mark;
        if (simgpu_tickets_done(e->dev, &last, 1, &(uint64_t){0}) && stream_queue(s, e->dev, &q) == 0 &&
            simgpu_engine_others_queued(e->dev, q) && simgpu_queue_submit(e->dev, q, 0, NULL, &mark) == 0)
            s->last = mark;
        simgpu_ticket_mark(e->dev, &s->last, &e->tk);
        atomic_store(&e->t_ns, e->tk.t_ns);
        if (e->tk.t_ns)
            memset(&e->tk, 0, sizeof(e->tk));
        pthread_mutex_unlock(&e->lock);
        pthread_mutex_unlock(&s->lock);
        return CUDA_SUCCESS;
    }
    uint64_t now = simgpu_now_ns();
    uint64_t end = atomic_load(&s->last_end);
    atomic_store(&e->t_ns, end > now ? end : now);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return cuEventRecord(hEvent, hStream);
}

/* CU_EVENT_RECORD_EXTERNAL only changes what a capture makes of the record (an event
 * node rather than an ordering point); outside capture it is a plain record. */
SIMGPU_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    if (flags & ~1u)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    return cuEventRecord(hEvent, hStream);
}

SIMGPU_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return cuEventRecordWithFlags(hEvent, hStream, flags);
}

static CUresult event_get(CUevent h, struct sg_event **out)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!h || !sg_handle_ok(h, SG_MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = (struct sg_event *)h;
    return CUDA_SUCCESS;
}

/* Timed engine: learn e's time if its work is done now. 1 when recorded and done (or
 * never recorded: *recorded 0), 0 while pending. */
static int event_resolve(struct sg_event *e, int *recorded)
{
    if (atomic_load(&e->t_ns)) {
        *recorded = 1;
        return 1;
    }
    pthread_mutex_lock(&e->lock);
    int done = 1;
    *recorded = atomic_load(&e->t_ns) || e->tk.seq;
    if (!atomic_load(&e->t_ns) && e->tk.seq) {
        done = simgpu_ticket_resolve(e->dev, &e->tk);
        if (done) {
            atomic_store(&e->t_ns, e->tk.t_ns);
            memset(&e->tk, 0, sizeof(e->tk));
        }
    }
    pthread_mutex_unlock(&e->lock);
    return done;
}

SIMGPU_API CUresult cuEventSynchronize(CUevent hEvent)
{
    struct sg_event *e;
    CUresult rc = event_get(hEvent, &e);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(NULL, NULL, atomic_load(&e->cap_id));
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t called = simgpu_now_ns();
    /* As the driver does without CU_EVENT_BLOCKING_SYNC the calling thread busy-waits
     * (a CPU's worth of time, which tests of a waiter's CPU use must see). */
    enum simgpu_how how = e->flags & CU_EVENT_BLOCKING_SYNC ? SIMGPU_SLEEP : SIMGPU_SPIN;
    if (timed() && !atomic_load(&e->t_ns)) {
        pthread_mutex_lock(&e->lock);
        struct simgpu_ticket t = e->tk;
        unsigned dev = e->dev;
        pthread_mutex_unlock(&e->lock);
        if (t.seq) {
            simgpu_tickets_wait(dev, &t, 1, called, how); /* the event's hold keeps its time */
            int recorded;
            event_resolve(e, &recorded);
            sg_pool_sync();
            return CUDA_SUCCESS;
        }
    }
    simgpu_wait_for(atomic_load(&e->t_ns), called, how); /* never recorded: 0, at once */
    sg_pool_sync();
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventQuery(CUevent hEvent)
{
    struct sg_event *e;
    CUresult rc = event_get(hEvent, &e);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(NULL, NULL, atomic_load(&e->cap_id));
    if (rc != CUDA_SUCCESS)
        return rc;
    int recorded;
    if (timed())
        return event_resolve(e, &recorded) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    return simgpu_now_ns() >= atomic_load(&e->t_ns) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIMGPU_API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    struct sg_event *a, *b;
    CUresult rc = event_get(hStart, &a);
    if (rc == CUDA_SUCCESS)
        rc = event_get(hEnd, &b);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if ((a->flags & CU_EVENT_DISABLE_TIMING) || (b->flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    if (timed()) {
        int ra, rb, da = event_resolve(a, &ra), db = event_resolve(b, &rb);
        if (!ra || !rb)
            return CUDA_ERROR_INVALID_HANDLE;
        if (!da || !db)
            return CUDA_ERROR_NOT_READY;
    }
    uint64_t t0 = atomic_load(&a->t_ns), t1 = atomic_load(&b->t_ns);
    if (!t0 || !t1)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = simgpu_now_ns();
    if (now < t0 || now < t1)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((int64_t)(t1 - t0)) / 1e6);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

SIMGPU_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_event *e = (struct sg_event *)hEvent;
    if (!e || !sg_handle_take(e, SG_MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->lock);
    simgpu_ticket_release(e->dev, &e->tk);
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_destroy(&e->lock);
    e->magic = SG_MAGIC_DEAD;
    free(e);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventDestroy(CUevent hEvent)
{
    return cuEventDestroy_v2(hEvent);
}

SIMGPU_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return cuStreamSynchronize(hStream);
}

SIMGPU_API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    return cuStreamQuery(hStream);
}

SIMGPU_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return cuStreamWaitEvent(hStream, hEvent, Flags);
}
