/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_context.c - a CUDA context holds device memory of its own (hundreds of
 * MiB on real GPUs) that no allocation call shows. The slice's
 * context_reserve is charged for each context a process creates, and for its
 * primary context on each device, and given back when it goes.
 */
#include <pthread.h>

#include "vgpu_internal.h"

/* Primary-context retains of this process per device and what they charged;
 * guarded by g_primary_lock. */
static int g_primary_refs[VG_MAX_DEVICES];
static uint64_t g_primary_bytes[VG_MAX_DEVICES];
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t reserve_of(int dev)
{
    struct vgpu_region *r = vg_region(dev);
    return r ? atomic_load(&r->context_reserve) : 0;
}

#define CREATE_CONTEXT(pctx, dev, call)                                                    \
    do {                                                                                   \
        CUresult ready_ = vg_ready();                                                      \
        if (ready_ != CUDA_SUCCESS)                                                        \
            return ready_;                                                                 \
        uint64_t bytes_ = reserve_of(dev);                                                 \
        if (bytes_ && vg_charge((dev), bytes_) != 0)                                       \
            return CUDA_ERROR_OUT_OF_MEMORY;                                               \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS)                                                            \
            vg_uncharge((dev), bytes_);                                                    \
        else if (bytes_)                                                                   \
            vg_allocs_put(VG_ALLOC_CTX, (uint64_t)(uintptr_t)*(pctx), (dev), bytes_);      \
        return r_;                                                                         \
    } while (0)

VG_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuCtxCreate_v2, pctx, flags, dev);
    CREATE_CONTEXT(pctx, dev, REAL(cuCtxCreate_v2)(pctx, flags, dev));
}

VG_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                                  CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuCtxCreate_v3, pctx, paramsArray, numParams, flags, dev);
    CREATE_CONTEXT(pctx, dev, REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev));
}

VG_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuCtxCreate_v4, pctx, params, flags, dev);
    CREATE_CONTEXT(pctx, dev, REAL(cuCtxCreate_v4)(pctx, params, flags, dev));
}

VG_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    VG_PASSTHROUGH_IF_INERT(cuCtxDestroy_v2, ctx);
    int dev;
    uint64_t bytes;
    int known = vg_allocs_take(VG_ALLOC_CTX, (uint64_t)(uintptr_t)ctx, &dev, &bytes);
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (known == 0) {
        if (r == CUDA_SUCCESS)
            vg_uncharge(dev, bytes);
        else
            vg_allocs_put(VG_ALLOC_CTX, (uint64_t)(uintptr_t)ctx, dev, bytes);
    }
    return r;
}

VG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuDevicePrimaryCtxRetain, pctx, dev);
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    CUresult r = vg_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_primary_lock);
    uint64_t bytes = 0;
    if (g_primary_refs[dev] == 0) {
        bytes = reserve_of(dev);
        if (bytes && vg_charge(dev, bytes) != 0) {
            pthread_mutex_unlock(&g_primary_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r == CUDA_SUCCESS) {
        if (g_primary_refs[dev]++ == 0)
            g_primary_bytes[dev] = bytes;
    } else if (bytes) {
        vg_uncharge(dev, bytes);
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

static void primary_drop(CUdevice dev, int all)
{
    if (g_primary_refs[dev] == 0)
        return;
    g_primary_refs[dev] = all ? 0 : g_primary_refs[dev] - 1;
    if (g_primary_refs[dev] == 0) {
        vg_uncharge(dev, g_primary_bytes[dev]);
        g_primary_bytes[dev] = 0;
    }
}

VG_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuDevicePrimaryCtxRelease_v2, dev);
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    if (r == CUDA_SUCCESS)
        primary_drop(dev, 0);
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

VG_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuDevicePrimaryCtxReset_v2, dev);
    if (dev < 0 || dev >= VG_MAX_DEVICES)
        return REAL(cuDevicePrimaryCtxReset_v2)(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = REAL(cuDevicePrimaryCtxReset_v2)(dev);
    if (r == CUDA_SUCCESS)
        primary_drop(dev, 1);
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}
