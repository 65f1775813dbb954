/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_mem.c - linear device memory, pinned host memory, copies and memset.
 *
 * A device allocation is charged to the shared state first and mapped second,
 * so a failed charge allocates nothing. The mapping is anonymous, private and
 * NORESERVE: a 16 GiB simulated device costs nothing until pages are touched.
 * Synchronous copies wait for the context's queued kernels first, as copies on
 * the legacy default stream do on a real GPU.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/vg_quantity.h"
#include "cuda_internal.h"

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) & ~(pg - 1);
}

/* SIMGPU_CONTEXT_MEMORY parsed once; 0 when unset, "0" or malformed. */
static uint64_t g_ctx_overhead;
static pthread_once_t g_ctx_once = PTHREAD_ONCE_INIT;

static void parse_overhead(void)
{
    const char *s = getenv("SIMGPU_CONTEXT_MEMORY");
    uint64_t b;
    if (s && *s && strcmp(s, "0") != 0 && vg_parse_quantity(s, &b) == 0)
        g_ctx_overhead = b;
}

uint64_t sg_context_overhead(void)
{
    pthread_once(&g_ctx_once, parse_overhead);
    return g_ctx_overhead;
}

CUresult sg_dev_alloc(int dev, size_t size, int kind, struct sg_ctx *ctx, CUdeviceptr *out)
{
    return sg_dev_alloc_in(dev, size, kind, ctx, NULL, out);
}

CUresult sg_dev_alloc_in(int dev, size_t size, int kind, struct sg_ctx *ctx, struct sg_pool *pool, CUdeviceptr *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* A pool charges the device itself, for what its freed bytes do not cover. */
    int charged = !pool && !(kind & (SG_KIND_HOST | SG_KIND_RESERVE));
    if (charged && simgpu_mem_charge(sg_phys(dev), size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (pool && sg_pool_charge(pool, size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = page_round(size);
    void *p = len < size ? MAP_FAILED
                         : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        goto fail;
    struct sg_range r = {
        .base = (uintptr_t)p, .size = size, .maplen = len, .dev = dev, .kind = kind, .ctx = ctx, .pool = pool};
    if (sg_range_add(&r) != 0) {
        munmap(p, len);
        goto fail;
    }
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
fail:
    if (charged)
        simgpu_mem_uncharge(sg_phys(dev), size);
    if (pool)
        sg_pool_release(pool, size); /* stays reserved in the pool, as a free would */
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void sg_range_release(const struct sg_range *r)
{
    if (r->kind == SG_KIND_RESERVE)
        return; /* reservations belong to no context; cuMemAddressFree frees them */
    munmap((void *)r->base, r->maplen);
    if (r->pool)
        sg_pool_release(r->pool, r->size); /* the pool keeps the bytes reserved */
    else if (r->kind & SG_KIND_DEVICE)
        simgpu_mem_uncharge(sg_phys(r->dev), r->size);
}

CUresult sg_dev_free(CUdeviceptr ptr, int kinds)
{
    struct sg_range r;
    if (sg_range_take((uintptr_t)ptr, kinds, &r) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sg_range_release(&r);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    return sg_dev_alloc(c->dev, bytesize, SG_KIND_MEM, c, dptr);
}

SIMGPU_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS; /* like free(NULL) */
    return sg_dev_free(dptr, SG_KIND_DEVICE);
}

SIMGPU_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    if (pitch < WidthInBytes || Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sg_dev_alloc(c->dev, pitch * Height, SG_KIND_PITCH, c, dptr);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

SIMGPU_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    return sg_dev_alloc(c->dev, bytesize, SG_KIND_MANAGED, c, dptr);
}

SIMGPU_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pp || (Flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p;
    /* Pinned host memory is not device memory: it is never charged. */
    if ((rc = sg_dev_alloc(c->dev, bytesize, SG_KIND_HOST, NULL, &p)) == CUDA_SUCCESS)
        *pp = (void *)(uintptr_t)p;
    return rc;
}

SIMGPU_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

SIMGPU_API CUresult cuMemAllocHost(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

SIMGPU_API CUresult cuMemFreeHost(void *p)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return sg_dev_free((CUdeviceptr)(uintptr_t)p, SG_KIND_HOST);
}

SIMGPU_API CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t t = sg_state()->dev[sg_phys(c->dev)].total_bytes;
    uint64_t used = simgpu_mem_used(sg_phys(c->dev));
    *total = (size_t)t;
    *free = (size_t)(used < t ? t - used : 0);
    return CUDA_SUCCESS;
}

/* The pre-CUDA-3.2 ABI: 32-bit counts, saturated. */
SIMGPU_API CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    size_t f, t;
    if (!free || !total)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free = f > 0xffffffffu ? 0xffffffffu : (unsigned int)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned int)t;
    }
    return rc;
}

SIMGPU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_range r;
    if (sg_range_find((uintptr_t)dptr, 1, &r) != 0 || !(r.kind & SG_KIND_DEVICE))
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = (CUdeviceptr)r.base;
    if (psize)
        *psize = r.size;
    return CUDA_SUCCESS;
}

/* ---- copies and memset ---- */

/* A device-side operand must lie inside a known allocation or reservation
 * (a reservation's unmapped pages would still fault: as on a GPU, a bug). */
static int dev_ok(CUdeviceptr p, size_t n)
{
    return sg_range_find((uintptr_t)p, n, NULL) == 0;
}

/* Wait for the current context's queued work (legacy-stream semantics). */
static CUresult sync_ctx(void)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        sg_ctx_wait(c);
    return rc;
}

/* An async operation needs a valid stream; the copy itself happens at once,
 * since simgpu kernels read and write no memory and cannot race with it. */
static CUresult check_stream(CUstream h)
{
    struct sg_stream *s;
    return sg_stream_resolve(h, &s);
}

static CUresult copy(void *dst, int dst_dev, const void *src, int src_dev, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src || (dst_dev && !dev_ok((CUdeviceptr)(uintptr_t)dst, n)) ||
        (src_dev && !dev_ok((CUdeviceptr)(uintptr_t)src, n)))
        return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}

#define D(p) ((void *)(uintptr_t)(p))

SIMGPU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : copy(D(dstDevice), 1, srcHost, 0, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : copy(dstHost, 0, D(srcDevice), 1, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : copy(D(dstDevice), 1, D(srcDevice), 1, ByteCount);
}

/* Unified addressing: either side may be host memory. */
SIMGPU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : copy(D(dst), 0, D(src), 0, ByteCount);
}

SIMGPU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : copy(D(dst), 0, D(src), 0, ByteCount);
}

SIMGPU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                         CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : copy(D(dstDevice), 1, srcHost, 0, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : copy(dstHost, 0, D(srcDevice), 1, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                         CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : copy(D(dstDevice), 1, D(srcDevice), 1, ByteCount);
}

static CUresult set8(CUdeviceptr dst, unsigned char uc, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dev_ok(dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    memset(D(dst), uc, n);
    return CUDA_SUCCESS;
}

static CUresult set32(CUdeviceptr dst, unsigned int ui, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if ((dst & 3) || n > SIZE_MAX / 4 || !dev_ok(dst, n * 4))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned int *p = D(dst);
    for (size_t i = 0; i < n; i++)
        p[i] = ui;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : set8(dstDevice, uc, N);
}

SIMGPU_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    CUresult rc = sync_ctx();
    return rc != CUDA_SUCCESS ? rc : set32(dstDevice, ui, N);
}

SIMGPU_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : set8(dstDevice, uc, N);
}

SIMGPU_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    CUresult rc = check_stream(hStream);
    return rc != CUDA_SUCCESS ? rc : set32(dstDevice, ui, N);
}

/* Per-thread-default-stream twins: simgpu has one default stream per context. */
SIMGPU_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return cuMemcpy(dst, src, ByteCount);
}

SIMGPU_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

SIMGPU_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

SIMGPU_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return cuMemsetD8_v2(dstDevice, uc, N);
}

SIMGPU_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return cuMemsetD32_v2(dstDevice, ui, N);
}

SIMGPU_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyAsync(dst, src, ByteCount, hStream);
}

SIMGPU_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                              CUstream hStream)
{
    return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

SIMGPU_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream)
{
    return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

SIMGPU_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                              CUstream hStream)
{
    return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}

SIMGPU_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    return cuMemsetD8Async(dstDevice, uc, N, hStream);
}

SIMGPU_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    return cuMemsetD32Async(dstDevice, ui, N, hStream);
}
