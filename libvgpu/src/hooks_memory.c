/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_memory.c - every device allocation path charges the slice first and
 * allocates only if the charge fit; every free gives back what was charged.
 * An allocation past the limit returns CUDA_ERROR_OUT_OF_MEMORY and the
 * driver is never asked, so nothing is allocated. A free into a memory pool
 * keeps its bytes charged while the pool holds them (pools.c).
 */
#include "../common/vg_array.h"
#include "vgpu_internal.h"

int vg_current_device(void)
{
    static CUresult (*get_device)(CUdevice *);
    if (!get_device)
        get_device = (CUresult(*)(CUdevice *))vg_driver_sym("cuCtxGetDevice");
    CUdevice dev;
    return get_device && get_device(&dev) == CUDA_SUCCESS ? dev : -1;
}

/* Charge, allocate through `call`, record; the shared shape of every path. */
#define CHARGE_OR_OOM(dev, bytes)                         \
    do {                                                  \
        CUresult ready_ = vg_ready();                     \
        if (ready_ != CUDA_SUCCESS)                       \
            return ready_;                                \
        if (vg_pools_make_room((dev), (bytes)) != 0)      \
            return CUDA_ERROR_OUT_OF_MEMORY;              \
    } while (0)

static CUresult finish_alloc(CUresult r, enum vg_alloc_kind kind, uint64_t key, int dev, uint64_t bytes)
{
    if (r != CUDA_SUCCESS)
        vg_uncharge(dev, bytes);
    else
        vg_allocs_put(kind, key, dev, bytes);
    return r;
}

/* Forget key before the driver frees it (a racing allocation may reuse the
 * address at once); put it back if the driver refused. */
#define FREE_TRACKED(kind, key, call)                               \
    do {                                                            \
        int dev_;                                                   \
        uint64_t bytes_;                                            \
        int known_ = vg_allocs_take((kind), (key), &dev_, &bytes_); \
        CUresult r_ = (call);                                       \
        if (known_ == 0) {                                          \
            if (r_ == CUDA_SUCCESS)                                 \
                vg_uncharge(dev_, bytes_);                          \
            else                                                    \
                vg_allocs_put((kind), (key), dev_, bytes_);         \
        }                                                           \
        return r_;                                                  \
    } while (0)

VG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAlloc_v2, dptr, bytesize);
    int dev = vg_current_device();
    if (!dptr || bytesize == 0 || dev < 0)
        return REAL(cuMemAlloc_v2)(dptr, bytesize); /* the driver's own error */
    CHARGE_OR_OOM(dev, bytesize);
    CUresult r = REAL(cuMemAlloc_v2)(dptr, bytesize);
    return finish_alloc(r, VG_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0, dev, bytesize);
}

/* A free of pool memory (cuMemFreeAsync, or cuMemFree of it): the pool keeps the
 * bytes, so they stay charged as the pool's (pools.c). Not pool memory: -1. */
static int free_pooled(CUdeviceptr dptr, CUresult (*real_free)(CUdeviceptr, CUstream), CUstream hStream,
                       CUresult *r)
{
    int slot;
    uint64_t bytes;
    if (vg_allocs_take(VG_ALLOC_ASYNC, dptr, &slot, &bytes) != 0)
        return -1;
    *r = real_free ? real_free(dptr, hStream) : REAL(cuMemFree_v2)(dptr);
    if (*r == CUDA_SUCCESS)
        vg_pools_freed(slot, bytes);
    else
        vg_allocs_put(VG_ALLOC_ASYNC, dptr, slot, bytes);
    return 0;
}

VG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    VG_PASSTHROUGH_IF_INERT(cuMemFree_v2, dptr);
    CUresult r;
    if (free_pooled(dptr, NULL, NULL, &r) == 0)
        return r;
    FREE_TRACKED(VG_ALLOC_PTR, dptr, REAL(cuMemFree_v2)(dptr));
}

VG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    int dev = vg_current_device();
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 || dev < 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* The pitch is the driver's choice: charge a 512-byte-aligned estimate
     * first, then settle on the real pitch * height. */
    uint64_t estimate = ((WidthInBytes + 511) & ~(size_t)511) * Height;
    CHARGE_OR_OOM(dev, estimate);
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        vg_uncharge(dev, estimate);
        return r;
    }
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > estimate && vg_charge(dev, actual - estimate) != 0) {
        REAL(cuMemFree_v2)(*dptr);
        vg_uncharge(dev, estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < estimate)
        vg_uncharge(dev, estimate - actual);
    vg_allocs_put(VG_ALLOC_PTR, *dptr, dev, actual);
    return r;
}

VG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    /* Managed memory can migrate to the device at any time: count all of it. */
    VG_PASSTHROUGH_IF_INERT(cuMemAllocManaged, dptr, bytesize, flags);
    int dev = vg_current_device();
    if (!dptr || bytesize == 0 || dev < 0)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    CHARGE_OR_OOM(dev, bytesize);
    CUresult r = REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    return finish_alloc(r, VG_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0, dev, bytesize);
}

/* ---- VMM: physical memory is what cuMemCreate makes; mapping costs nothing ---- */

VG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    VG_PASSTHROUGH_IF_INERT(cuMemCreate, handle, size, prop, flags);
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    int dev = prop->location.id;
    CHARGE_OR_OOM(dev, size);
    CUresult r = REAL(cuMemCreate)(handle, size, prop, flags);
    return finish_alloc(r, VG_ALLOC_VMM, r == CUDA_SUCCESS ? *handle : 0, dev, size);
}

VG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    VG_PASSTHROUGH_IF_INERT(cuMemRelease, handle);
    FREE_TRACKED(VG_ALLOC_VMM, handle, REAL(cuMemRelease)(handle));
}

/* ---- stream-ordered allocations: charged at the allocation; a free into the pool
 * keeps them charged until the pool releases them (pools.c) ---- */

static CUresult alloc_pooled(CUresult r, CUdeviceptr *dptr, int slot, int dev, uint64_t bytes)
{
    if (r != CUDA_SUCCESS || slot < 0)
        return finish_alloc(r, VG_ALLOC_PTR, r == CUDA_SUCCESS ? *dptr : 0, dev, bytes);
    vg_pools_allocated(slot, bytes);
    vg_allocs_put(VG_ALLOC_ASYNC, *dptr, slot, bytes);
    return r;
}

static CUresult alloc_async(CUresult (*real)(CUdeviceptr *, size_t, CUstream), CUdeviceptr *dptr, size_t bytesize,
                            CUstream hStream)
{
    int dev = vg_current_device();
    if (!dptr || bytesize == 0 || dev < 0)
        return real(dptr, bytesize, hStream);
    CUmemoryPool pool = vg_pools_current(dev);
    int slot = vg_pools_slot(pool, dev);
    if (pool && slot < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* too many pools to account for: fail closed */
    CHARGE_OR_OOM(dev, bytesize);
    return alloc_pooled(real(dptr, bytesize, hStream), dptr, slot, dev, bytesize);
}

VG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAllocAsync, dptr, bytesize, hStream);
    return alloc_async(REAL(cuMemAllocAsync), dptr, bytesize, hStream);
}

VG_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
    return alloc_async(REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream);
}

VG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemFreeAsync, dptr, hStream);
    CUresult r;
    if (free_pooled(dptr, REAL(cuMemFreeAsync), hStream, &r) == 0)
        return r;
    FREE_TRACKED(VG_ALLOC_PTR, dptr, REAL(cuMemFreeAsync)(dptr, hStream));
}

VG_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemFreeAsync_ptsz, dptr, hStream);
    CUresult r;
    if (free_pooled(dptr, REAL(cuMemFreeAsync_ptsz), hStream, &r) == 0)
        return r;
    FREE_TRACKED(VG_ALLOC_PTR, dptr, REAL(cuMemFreeAsync_ptsz)(dptr, hStream));
}

VG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    /* Remember each pool's device so allocations from it charge the right GPU. */
    VG_PASSTHROUGH_IF_INERT(cuMemPoolCreate, pool, poolProps);
    CUresult r = REAL(cuMemPoolCreate)(pool, poolProps);
    if (r == CUDA_SUCCESS && poolProps && poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        vg_pools_slot(*pool, poolProps->location.id);
    return r;
}

VG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    VG_PASSTHROUGH_IF_INERT(cuMemPoolDestroy, pool);
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS)
        vg_pools_destroyed(pool);
    return r;
}

VG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    VG_PASSTHROUGH_IF_INERT(cuMemPoolTrimTo, pool, minBytesToKeep);
    CUresult r = REAL(cuMemPoolTrimTo)(pool, minBytesToKeep);
    if (r == CUDA_SUCCESS)
        vg_pools_reconcile_pool(pool); /* give back at once what the trim released */
    return r;
}

VG_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    VG_PASSTHROUGH_IF_INERT(cuDeviceSetMemPool, dev, pool);
    CUresult r = REAL(cuDeviceSetMemPool)(dev, pool);
    if (r == CUDA_SUCCESS)
        vg_pools_set_current(dev, pool);
    return r;
}

static CUresult alloc_from_pool(CUresult (*real)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), CUdeviceptr *dptr,
                                size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    /* A pool not seen before is a device's default pool: the current device's. */
    int slot = pool ? vg_pools_slot(pool, vg_current_device()) : -1;
    int dev = slot >= 0 ? vg_pools_slot_dev(slot) : vg_current_device();
    if (!dptr || !pool || bytesize == 0 || dev < 0)
        return real(dptr, bytesize, pool, hStream);
    if (slot < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* too many pools to account for: fail closed */
    CHARGE_OR_OOM(dev, bytesize);
    return alloc_pooled(real(dptr, bytesize, pool, hStream), dptr, slot, dev, bytesize);
}

VG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
    return alloc_from_pool(REAL(cuMemAllocFromPoolAsync), dptr, bytesize, pool, hStream);
}

VG_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream)
{
    VG_PASSTHROUGH_IF_INERT(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
    return alloc_from_pool(REAL(cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool, hStream);
}

/* ---- arrays ---- */

VG_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    VG_PASSTHROUGH_IF_INERT(cuArrayCreate_v2, pHandle, desc);
    int dev = vg_current_device();
    if (!pHandle || !desc || desc->Width == 0 || dev < 0)
        return REAL(cuArrayCreate_v2)(pHandle, desc);
    uint64_t bytes = vg_array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1);
    if (bytes == 0)
        return REAL(cuArrayCreate_v2)(pHandle, desc); /* invalid: the driver's own error */
    CHARGE_OR_OOM(dev, bytes);
    CUresult r = REAL(cuArrayCreate_v2)(pHandle, desc);
    return finish_alloc(r, VG_ALLOC_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, dev, bytes);
}

VG_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    VG_PASSTHROUGH_IF_INERT(cuArray3DCreate_v2, pHandle, desc);
    int dev = vg_current_device();
    if (!pHandle || !desc || desc->Width == 0 || dev < 0)
        return REAL(cuArray3DCreate_v2)(pHandle, desc);
    uint64_t bytes = vg_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1);
    if (bytes == 0)
        return REAL(cuArray3DCreate_v2)(pHandle, desc);
    CHARGE_OR_OOM(dev, bytes);
    CUresult r = REAL(cuArray3DCreate_v2)(pHandle, desc);
    return finish_alloc(r, VG_ALLOC_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, dev, bytes);
}

VG_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    VG_PASSTHROUGH_IF_INERT(cuArrayDestroy, hArray);
    FREE_TRACKED(VG_ALLOC_ARRAY, (uint64_t)(uintptr_t)hArray, REAL(cuArrayDestroy)(hArray));
}

VG_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int numMipmapLevels)
{
    VG_PASSTHROUGH_IF_INERT(cuMipmappedArrayCreate, pHandle, desc, numMipmapLevels);
    int dev = vg_current_device();
    if (!pHandle || !desc || desc->Width == 0 || numMipmapLevels == 0 || dev < 0)
        return REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels);
    uint64_t bytes =
        vg_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, numMipmapLevels);
    if (bytes == 0)
        return REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels);
    CHARGE_OR_OOM(dev, bytes);
    CUresult r = REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels);
    return finish_alloc(r, VG_ALLOC_ARRAY, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, dev, bytes);
}

VG_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    VG_PASSTHROUGH_IF_INERT(cuMipmappedArrayDestroy, hMipmappedArray);
    FREE_TRACKED(VG_ALLOC_ARRAY, (uint64_t)(uintptr_t)hMipmappedArray, REAL(cuMipmappedArrayDestroy)(hMipmappedArray));
}
