/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_pool.c - stream-ordered allocation (cuMemAllocAsync and memory pools).
 *
 * A pool keeps what is freed into it reserved, as the driver's does: the bytes
 * stay charged to the device (cuMemGetInfo, NVML) and a later allocation from
 * the same pool takes them before the device is charged anew. A free is
 * *pending* until the process next synchronises (a stream, event or context
 * sync: the driver's "completion observed on the host"); at each such sync the
 * pending bytes become *cached*, and every pool of the process that then
 * reserves more than its release threshold gives cached bytes back to the
 * device down to the threshold (default 0: all of them). cuMemPoolTrimTo gives
 * back cached bytes down to its argument; pending ones count as outstanding.
 * The frees themselves happen at cuMemFreeAsync (simgpu kernels never touch
 * memory), so only the accounting is stream-ordered. Allocations are owned by
 * the stream's context.
 *
 * The attributes are answered from that model: the release threshold and reuse
 * flags as set (reuse is not simulated: any freed byte of the pool is reused),
 * reserved = in use + pending + cached, the memory in use, and their high
 * watermarks. A pool destroyed with allocations outstanding lives on until the
 * last is freed, as the driver's does; it caches nothing after the destroy.
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
    _Atomic int reuse[3];       /* the REUSE_* flags, as set (1 by default) */
    _Atomic uint64_t threshold; /* RELEASE_THRESHOLD, as set */
    pthread_mutex_t lock;       /* guards the amounts below */
    uint64_t used;              /* bytes allocated from it and not yet freed */
    uint64_t pending;           /* freed, not yet observed by a sync: reusable, not trimmable */
    uint64_t cached;            /* freed and observed: reusable, released at syncs and trims */
    uint64_t used_high;         /* high watermarks since the last reset */
    uint64_t reserved_high;
    int destroyed;              /* cuMemPoolDestroy'd: frees go straight back to the device */
    _Atomic uint64_t refs;      /* 1 for the handle (until destroyed) + 1 per live allocation */
    struct sg_pool *next;       /* the process's live pools (g_pools), under g_pool_lock */
};

static void pool_init(struct sg_pool *p, int dev, int is_default)
{
    p->dev = dev;
    p->is_default = is_default;
    for (int i = 0; i < 3; i++)
        atomic_store(&p->reuse[i], 1);
    atomic_store(&p->threshold, 0);
    pthread_mutex_init(&p->lock, NULL);
    p->used = p->pending = p->cached = p->used_high = p->reserved_high = 0;
    p->destroyed = 0;
    atomic_store(&p->refs, 1);
}

static void pool_unref(struct sg_pool *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1 && !p->is_default) { /* destroyed, last allocation gone */
        p->magic = SG_MAGIC_DEAD;
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
}

/* Give up to `bytes` cached bytes of p back to the device; p->lock held. */
static void give_back(struct sg_pool *p, uint64_t bytes)
{
    if (bytes > p->cached)
        bytes = p->cached;
    if (bytes == 0)
        return;
    p->cached -= bytes;
    simgpu_mem_uncharge(sg_phys(p->dev), bytes);
}

int sg_pool_charge(struct sg_pool *p, size_t size)
{
    pthread_mutex_lock(&p->lock);
    /* Freed bytes of the pool first (cached, then pending), the device for the rest. */
    uint64_t from_cached = size < p->cached ? size : p->cached;
    uint64_t rest = size - from_cached;
    uint64_t from_pending = rest < p->pending ? rest : p->pending;
    uint64_t fresh = rest - from_pending;
    if (fresh && simgpu_mem_charge(sg_phys(p->dev), fresh) != 0) {
        pthread_mutex_unlock(&p->lock);
        return -1;
    }
    p->cached -= from_cached;
    p->pending -= from_pending;
    p->used += size;
    if (p->used > p->used_high)
        p->used_high = p->used;
    uint64_t reserved = p->used + p->pending + p->cached;
    if (reserved > p->reserved_high)
        p->reserved_high = reserved;
    atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void sg_pool_release(struct sg_pool *p, size_t size)
{
    pthread_mutex_lock(&p->lock);
    p->used -= size;
    if (p->destroyed)
        simgpu_mem_uncharge(sg_phys(p->dev), size);
    else
        p->pending += size;
    pthread_mutex_unlock(&p->lock);
    pool_unref(p);
}

/* Each device's default pool: static, registered on first use under g_pool_lock.
 * g_pools lists every live pool of the process (defaults and created ones), for
 * the syncs that release what pools cache. */
static struct sg_pool g_default[SIMGPU_MAX_DEVICES];
static struct sg_pool *g_pools;
/* The pool cuDeviceSetMemPool made current per device (NULL: the default one), under
 * g_pool_lock; a destroy makes the default current again. */
static struct sg_pool *g_current[SIMGPU_MAX_DEVICES];
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;

void sg_pool_sync(void)
{
    pthread_mutex_lock(&g_pool_lock);
    for (struct sg_pool *p = g_pools; p; p = p->next) {
        pthread_mutex_lock(&p->lock);
        p->cached += p->pending;
        p->pending = 0;
        uint64_t reserved = p->used + p->cached, threshold = atomic_load(&p->threshold);
        if (reserved > threshold)
            give_back(p, reserved - threshold);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&g_pool_lock);
}

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
        } else {
            p->next = g_pools;
            g_pools = p;
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
    pthread_mutex_lock(&g_pool_lock);
    p->next = g_pools;
    g_pools = p;
    pthread_mutex_unlock(&g_pool_lock);
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
    pthread_mutex_lock(&g_pool_lock);
    for (struct sg_pool **pp = &g_pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (g_current[p->dev] == p)
        g_current[p->dev] = NULL;
    pthread_mutex_unlock(&g_pool_lock);
    /* What it holds unused goes back now; outstanding allocations stay valid until
     * freed (each then goes straight back), and the last one frees the pool. */
    pthread_mutex_lock(&p->lock);
    p->destroyed = 1;
    p->cached += p->pending;
    p->pending = 0;
    give_back(p, p->cached);
    pthread_mutex_unlock(&p->lock);
    pool_unref(p);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || !sg_handle_ok(p, SG_MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    /* Only cached bytes go: in use and pending ones are outstanding (file comment). */
    pthread_mutex_lock(&p->lock);
    uint64_t reserved = p->used + p->pending + p->cached;
    if (reserved > minBytesToKeep)
        give_back(p, reserved - minBytesToKeep);
    pthread_mutex_unlock(&p->lock);
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
    if (pool)
        return sg_dev_alloc_in(pool->dev, bytesize, SG_KIND_ASYNC, s->ctx, pool, dptr);
    /* The device's current pool, held by a reference so a racing destroy cannot free it. */
    pthread_mutex_lock(&g_pool_lock);
    if ((pool = g_current[s->ctx->dev]))
        atomic_fetch_add(&pool->refs, 1);
    pthread_mutex_unlock(&g_pool_lock);
    if (!pool) {
        if (!(pool = default_pool(s->ctx->dev)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        return sg_dev_alloc_in(pool->dev, bytesize, SG_KIND_ASYNC, s->ctx, pool, dptr);
    }
    rc = sg_dev_alloc_in(pool->dev, bytesize, SG_KIND_ASYNC, s->ctx, pool, dptr);
    pool_unref(pool);
    return rc;
}

SIMGPU_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult rc = sg_check_dev(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_pool *p = (struct sg_pool *)pool;
    if (!p || !sg_handle_ok(p, SG_MAGIC_POOL) || p->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_pool_lock);
    g_current[dev] = p->is_default ? NULL : p;
    pthread_mutex_unlock(&g_pool_lock);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = sg_check_dev(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_pool_lock);
    struct sg_pool *p = g_current[dev];
    pthread_mutex_unlock(&g_pool_lock);
    if (!p && !(p = default_pool(dev)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
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
        pthread_mutex_lock(&p->lock);
        *(attr == SG_POOL_USED_MEM_HIGH ? &p->used_high : &p->reserved_high) = 0;
        pthread_mutex_unlock(&p->lock);
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
    case SG_POOL_RESERVED_MEM_CURRENT:
    case SG_POOL_RESERVED_MEM_HIGH:
    case SG_POOL_USED_MEM_CURRENT:
    case SG_POOL_USED_MEM_HIGH:
        pthread_mutex_lock(&p->lock);
        v64 = attr == SG_POOL_RESERVED_MEM_CURRENT ? p->used + p->pending + p->cached
              : attr == SG_POOL_RESERVED_MEM_HIGH  ? p->reserved_high
              : attr == SG_POOL_USED_MEM_CURRENT   ? p->used
                                                   : p->used_high;
        pthread_mutex_unlock(&p->lock);
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
