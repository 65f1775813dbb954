/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_pool.c - stream-ordered allocation (cuMemAllocAsync and memory pools).
 *
 * simgpu pools keep no cache: every pool behaves as if its release threshold
 * were 0, so an allocation is charged when it is made and uncharged when it is
 * freed (at cuMemFreeAsync, without waiting for the stream, because simgpu
 * kernels never touch memory). cuMemPoolTrimTo therefore has nothing to give
 * back and simply succeeds. Allocations are owned by the stream's context.
 */
#include <stdlib.h>

#include "cuda_internal.h"

struct sg_pool {
    uint32_t magic;
    int dev;
    int is_default;
};

/* Each device's default pool: static, registered on first use under g_pool_lock. */
static struct sg_pool g_default[SIMGPU_MAX_DEVICES];
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;

static struct sg_pool *default_pool(int dev)
{
    struct sg_pool *p = &g_default[dev];
    pthread_mutex_lock(&g_pool_lock);
    if (p->magic != SG_MAGIC_POOL) {
        p->dev = dev;
        p->is_default = 1;
        p->magic = SG_MAGIC_POOL;
        if (sg_handle_add(p) != 0) {
            p->magic = 0;
            p = NULL;
        }
    }
    pthread_mutex_unlock(&g_pool_lock);
    return p;
}

SIMGPU_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sg_check_dev(dev)) != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = default_pool(dev);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool_out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (sg_check_dev(poolProps->location.id) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = SG_MAGIC_POOL;
    p->dev = poolProps->location.id;
    if (sg_handle_add(p) != 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || (p >= g_default && p < g_default + SIMGPU_MAX_DEVICES) || !sg_handle_take(p, SG_MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    /* Outstanding allocations stay valid until freed: they only remember the device. */
    p->magic = SG_MAGIC_DEAD;
    free(p);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep; /* no cache to trim: see the file comment */
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool || !sg_handle_ok(pool, SG_MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult alloc_on(CUdeviceptr *dptr, size_t bytesize, int dev_or_neg, CUstream hStream)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = dev_or_neg >= 0 ? dev_or_neg : s->ctx->dev;
    return sg_dev_alloc(dev, bytesize, SG_KIND_ASYNC, s->ctx, dptr);
}

SIMGPU_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_on(dptr, bytesize, -1, hStream);
}

SIMGPU_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream hStream)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || !sg_handle_ok(p, SG_MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(dptr, bytesize, p->dev, hStream);
}

SIMGPU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* The driver accepts any device allocation here, not only pool memory. */
    return sg_dev_free(dptr, SG_KIND_DEVICE);
}

SIMGPU_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

SIMGPU_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return cuMemFreeAsync(dptr, hStream);
}

SIMGPU_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}
