/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_ctx.c - contexts: primary contexts, created contexts and the per-thread
 * context stack.
 *
 * Context structs are never freed: a destroyed context only loses its magic and
 * its registry entry, so a stream or a thread that still points at it reads a
 * dead object (CUDA_ERROR_INVALID_CONTEXT) rather than freed memory. The leak is
 * one small struct per cuCtxCreate/cuCtxDestroy pair.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define SG_CTX_STACK 64

/* The calling thread's context stack (cuCtxPush/Pop; SetCurrent replaces the top). */
static __thread struct sg_ctx *tl_stack[SG_CTX_STACK];
static __thread int tl_depth;

/* One primary context per device, retained by count; g_plock guards refs/active. */
static struct sg_ctx g_primary[SIMGPU_MAX_DEVICES];
static pthread_mutex_t g_plock = PTHREAD_MUTEX_INITIALIZER;

static int ctx_alive(const struct sg_ctx *c)
{
    return c && c->magic == SG_MAGIC_CTX && (!c->primary || c->active);
}

CUresult sg_current_ctx(struct sg_ctx **out)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_ctx *c = tl_depth > 0 ? tl_stack[tl_depth - 1] : NULL;
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* Charge the context's own reservation and reset its timeline. */
static CUresult ctx_activate(struct sg_ctx *c, int dev, unsigned flags)
{
    c->dev = dev;
    c->flags = flags;
    c->overhead = sg_context_overhead();
    if (c->overhead && simgpu_mem_charge(sg_phys(dev), c->overhead) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_store(&c->last_end, 0);
    /* A primary context is re-activated in place: keep its stream's mutex,
     * which another thread may be holding, rather than re-initialising it. */
    if (c->null_stream.magic != SG_MAGIC_STREAM)
        sg_stream_init(&c->null_stream, c, 0);
    atomic_store(&c->null_stream.last_end, 0);
    memset(&c->null_stream.last, 0, sizeof(c->null_stream.last));
    return CUDA_SUCCESS;
}

/* Free what the context owns: its allocations and its reservation. */
static void ctx_teardown(struct sg_ctx *c)
{
    struct sg_range r;
    while (sg_range_take_ctx(c, &r) == 0)
        sg_range_release(&r);
    if (c->overhead)
        simgpu_mem_uncharge(sg_phys(c->dev), c->overhead);
    c->overhead = 0;
}

/* Drop c from the calling thread's stack wherever it appears. */
static void unstack(const struct sg_ctx *c)
{
    int j = 0;
    for (int i = 0; i < tl_depth; i++)
        if (tl_stack[i] != c)
            tl_stack[j++] = tl_stack[i];
    tl_depth = j;
}

SIMGPU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    struct sg_ctx *c = &g_primary[dev];
    pthread_mutex_lock(&g_plock);
    if (c->magic != SG_MAGIC_CTX) {
        c->magic = SG_MAGIC_CTX;
        c->primary = 1;
        if (sg_handle_add(c) != 0) {
            c->magic = 0;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    if (c->refs == 0) {
        if ((rc = ctx_activate(c, dev, c->flags)) != CUDA_SUCCESS)
            goto out;
        c->active = 1;
    }
    c->refs++;
    *pctx = (CUcontext)c;
out:
    pthread_mutex_unlock(&g_plock);
    return rc;
}

static CUresult primary_drop(CUdevice dev, int all)
{
    CUresult rc = sg_check_dev(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_ctx *c = &g_primary[dev];
    pthread_mutex_lock(&g_plock);
    if (c->refs == 0) {
        /* Reset of an inactive primary context is fine; releasing one is not. */
        rc = all ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
        goto out;
    }
    c->refs = all ? 0 : c->refs - 1;
    if (c->refs == 0) {
        c->active = 0;
        ctx_teardown(c);
    }
out:
    pthread_mutex_unlock(&g_plock);
    return rc;
}

SIMGPU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_drop(dev, 0);
}

SIMGPU_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_drop(dev, 0);
}

SIMGPU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_drop(dev, 1);
}

SIMGPU_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_drop(dev, 1);
}

SIMGPU_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult rc = sg_check_dev(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_plock);
    *flags = g_primary[dev].flags;
    *active = g_primary[dev].active;
    pthread_mutex_unlock(&g_plock);
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    if (tl_depth >= SG_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sg_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = SG_MAGIC_CTX;
    if ((rc = ctx_activate(c, dev, flags)) != CUDA_SUCCESS) {
        free(c);
        return rc;
    }
    if (sg_handle_add(c) != 0) {
        ctx_teardown(c);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    tl_stack[tl_depth++] = c; /* a new context is pushed on the creating thread */
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

SIMGPU_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

/* Execution-affinity parameters (SM counts) have no meaning on simgpu. */
SIMGPU_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                                   CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

SIMGPU_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                   CUdevice dev)
{
    (void)ctxCreateParams; /* affinity / CIG parameters: nothing to simulate */
    return ctx_create(pctx, flags, dev);
}

SIMGPU_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_ctx *c = (struct sg_ctx *)ctx;
    /* Primary contexts go through Release/Reset, never Destroy. */
    if (!c || (c >= g_primary && c < g_primary + SIMGPU_MAX_DEVICES) || !sg_handle_take(c, SG_MAGIC_CTX))
        return CUDA_ERROR_INVALID_CONTEXT;
    unstack(c);
    ctx_teardown(c);
    c->magic = SG_MAGIC_DEAD; /* kept allocated: see the header comment */
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxDestroy(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

SIMGPU_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ctx) {
        if (tl_depth > 0)
            tl_depth--;
        return CUDA_SUCCESS;
    }
    if (!sg_handle_ok(ctx, SG_MAGIC_CTX))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tl_depth == 0)
        tl_depth = 1;
    tl_stack[tl_depth - 1] = (struct sg_ctx *)ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = tl_depth > 0 ? (CUcontext)tl_stack[tl_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ctx || !sg_handle_ok(ctx, SG_MAGIC_CTX))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tl_depth >= SG_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tl_stack[tl_depth++] = (struct sg_ctx *)ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxPushCurrent(CUcontext ctx)
{
    return cuCtxPushCurrent_v2(ctx);
}

SIMGPU_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (tl_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct sg_ctx *c = tl_stack[--tl_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    return cuCtxPopCurrent_v2(pctx);
}

SIMGPU_API CUresult cuCtxSynchronize(void)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(NULL, c, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    sg_ctx_wait(c);
    sg_pool_sync();
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetDevice(CUdevice *device)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

/* CUDA 13: the context is explicit; NULL means the current one. */
static CUresult ctx_or_current(CUcontext ctx, struct sg_ctx **out)
{
    if (!ctx)
        return sg_current_ctx(out);
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!sg_handle_ok(ctx, SG_MAGIC_CTX) || !ctx_alive((struct sg_ctx *)ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct sg_ctx *)ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    struct sg_ctx *c;
    CUresult rc = ctx_or_current(ctx, &c);
    if (rc == CUDA_SUCCESS)
        rc = sg_capture_guard(NULL, c, 0);
    if (rc == CUDA_SUCCESS) {
        sg_ctx_wait(c);
        sg_pool_sync();
    }
    return rc;
}

SIMGPU_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    struct sg_ctx *c;
    CUresult rc = ctx_or_current(ctx, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetFlags(unsigned int *flags)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx && !sg_handle_ok(ctx, SG_MAGIC_CTX))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx && tl_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 12010; /* the context ABI version current drivers report */
    return CUDA_SUCCESS;
}
