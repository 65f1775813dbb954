/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_pool.c - stream-ordered allocation (cuMemAllocAsync and memory pools).
 *
 * simgpu pools keep no cache: every pool behaves as if its release threshold
 * were 0, so an allocation is charged when it is made and uncharged when it is
 * freed (at cuMemFreeAsync, without waiting for the stream, because simgpu
 * kernels never touch memory). cuMemPoolTrimTo therefore has nothing to give
 * back and simply succeeds. Allocations are owned by the stream's context.
 *
 * The attributes are kept and answered: the release threshold and reuse flags as
 * set (they change nothing here), the memory in use and its high watermark as
 * counted, and the reserved memory equal to the memory in use (nothing cached).
 * A pool destroyed with allocations outstanding lives on until the last is freed,
 * as the driver's does.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* CUmemPool_attribute */
enum {
    SG_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    SG_POOL_REUSE_ALLOW_OPPORTUNISTIC = 2,
    SG_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    SG_POOL_RELEASE_THRESHOLD = 4,
    SG_POOL_RESERVED_MEM_CURRENT = 5,
    SG_POOL_RESERVED_MEM_HIGH = 6,
    SG_POOL_USED_MEM_CURRENT = 7,
    SG_POOL_USED_MEM_HIGH = 8
};

struct sg_pool {
    uint32_t magic;
    int dev;
    int is_default;
    _Atomic int reuse[3];          /* the REUSE_* flags, as set (1 by default) */
    _Atomic uint64_t threshold;    /* RELEASE_THRESHOLD, as set (no effect: nothing is cached) */
    _Atomic uint64_t used;         /* bytes allocated from it and not yet freed */
    _Atomic uint64_t used_high;    /* its high watermark since the last reset */
    _Atomic uint64_t reserved_high;
    _Atomic uint64_t refs;         /* 1 for the handle (until destroyed) + 1 per live allocation */
};

static void pool_init(struct sg_pool *p, int dev, int is_default)
{
    p->dev = dev;
    p->is_default = is_default;
    for (int i = 0; i < 3; i++)
        atomic_store(&p->reuse[i], 1);
    atomic_store(&p->threshold, 0);
    atomic_store(&p->used, 0);
    atomic_store(&p->used_high, 0);
    atomic_store(&p->reserved_high, 0);
    atomic_store(&p->refs, 1);
}

static void raise_to(_Atomic uint64_t *high, uint64_t v)
{
    uint64_t h = atomic_load(high);
    while (h < v && !atomic_compare_exchange_weak(high, &h, v))
        ;
}

static void pool_unref(struct sg_pool *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1 && !p->is_default) { /* destroyed, last allocation gone */
        p->magic = SG_MAGIC_DEAD;
        free(p);
    }
}

void sg_pool_charge(struct sg_pool *p, size_t size)
{
    atomic_fetch_add(&p->refs, 1);
    uint64_t used = atomic_fetch_add(&p->used, size) + size;
    raise_to(&p->used_high, used);
    raise_to(&p->reserved_high, used);
}

void sg_pool_release(struct sg_pool *p, size_t size)
{
    atomic_fetch_sub(&p->used, size);
    pool_unref(p);
}

/* Each device's default pool: static, registered on first use under g_pool_lock. */
static struct sg_pool g_default[SIMGPU_MAX_DEVICES];
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;

static struct sg_pool *default_pool(int dev)
{
    struct sg_pool *p = &g_default[dev];
    pthread_mutex_lock(&g_pool_lock);
    if (p->magic != SG_MAGIC_POOL) {
        pool_init(p, dev, 1);
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
    pool_init(p, poolProps->location.id, 0);
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
    /* Outstanding allocations stay valid until freed; the last one frees the pool. */
    pool_unref(p);
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

/* From pool, or (NULL) from the default pool of the stream's device. */
static CUresult alloc_on(CUdeviceptr *dptr, size_t bytesize, struct sg_pool *pool, CUstream hStream)
{
    struct sg_stream *s;
    CUresult rc = sg_stream_resolve(hStream, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!pool && !(pool = default_pool(s->ctx->dev)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return sg_dev_alloc_in(pool->dev, bytesize, SG_KIND_ASYNC, s->ctx, pool, dptr);
}

SIMGPU_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_on(dptr, bytesize, NULL, hStream);
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
    return alloc_on(dptr, bytesize, p, hStream);
}

SIMGPU_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || !sg_handle_ok(p, SG_MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v64;
    switch (attr) {
    case SG_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case SG_POOL_REUSE_ALLOW_OPPORTUNISTIC:
    case SG_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        atomic_store(&p->reuse[attr - 1], *(const int *)value);
        return CUDA_SUCCESS;
    case SG_POOL_RELEASE_THRESHOLD:
        memcpy(&v64, value, sizeof(v64));
        atomic_store(&p->threshold, v64);
        return CUDA_SUCCESS;
    case SG_POOL_RESERVED_MEM_HIGH: /* a high watermark can only be reset to zero */
    case SG_POOL_USED_MEM_HIGH:
        memcpy(&v64, value, sizeof(v64));
        if (v64 != 0)
            return CUDA_ERROR_INVALID_VALUE;
        atomic_store(attr == SG_POOL_USED_MEM_HIGH ? &p->used_high : &p->reserved_high, 0);
        return CUDA_SUCCESS;
    default: /* the current amounts are read-only */
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIMGPU_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || !sg_handle_ok(p, SG_MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v64;
    switch (attr) {
    case SG_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case SG_POOL_REUSE_ALLOW_OPPORTUNISTIC:
    case SG_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = atomic_load(&p->reuse[attr - 1]);
        return CUDA_SUCCESS;
    case SG_POOL_RELEASE_THRESHOLD:
        v64 = atomic_load(&p->threshold);
        break;
    case SG_POOL_RESERVED_MEM_CURRENT: /* nothing cached: what is reserved is what is used */
    case SG_POOL_USED_MEM_CURRENT:
        v64 = atomic_load(&p->used);
        break;
    case SG_POOL_RESERVED_MEM_HIGH:
        v64 = atomic_load(&p->reserved_high);
        break;
    case SG_POOL_USED_MEM_HIGH:
        v64 = atomic_load(&p->used_high);
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(value, &v64, sizeof(v64));
    return CUDA_SUCCESS;
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
