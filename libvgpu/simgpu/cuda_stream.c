/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_stream.c - streams and events on the simulated engine timeline.
 *
 * A device's engine runs kernels from every process one at a time in
 * submission order (simgpu_engine_submit), so a stream only needs to remember
 * when its last kernel ends: work is never reordered, synchronising is a sleep
 * until that time, and an event records the time at which the stream's queued
 * work ends (or now, when the stream is idle).
 */
#include <stdlib.h>

#include "cuda_internal.h"

struct sg_event {
    uint32_t magic;
    unsigned flags;
    _Atomic uint64_t t_ns; /* completion time of the recorded work; 0 = never recorded */
    _Atomic uint64_t cap_id; /* the capture it was last recorded into, 0: none */
};

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
    uint64_t end = simgpu_engine_submit(sg_phys(s->ctx->dev), dur_ns);
    sg_stream_note_end(s, end);
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
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
    simgpu_sync_until(atomic_load(&s->last_end));
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

/* The engine is one FIFO, so work queued after the event already runs after it:
 * waiting needs no more than carrying the event's time into the stream. */
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
    if (!sg_capture_id(s, NULL))
        sg_stream_note_end(s, atomic_load(&e->t_ns));
    return CUDA_SUCCESS;
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
    if (sg_handle_add(e) != 0) {
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

SIMGPU_API CUresult cuEventSynchronize(CUevent hEvent)
{
    struct sg_event *e;
    CUresult rc = event_get(hEvent, &e);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(NULL, NULL, atomic_load(&e->cap_id));
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t t = atomic_load(&e->t_ns); /* never recorded: 0, returns at once */
    /* As the driver does without CU_EVENT_BLOCKING_SYNC the calling thread busy-waits
     * (a CPU's worth of time, which tests of a waiter's CPU use must see). */
    if (e->flags & CU_EVENT_BLOCKING_SYNC)
        simgpu_wait_until(t);
    else
        simgpu_spin_until(t);
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
    uint64_t t0 = atomic_load(&a->t_ns), t1 = atomic_load(&b->t_ns);
    if (!t0 || !t1 || (a->flags & CU_EVENT_DISABLE_TIMING) || (b->flags & CU_EVENT_DISABLE_TIMING))
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
