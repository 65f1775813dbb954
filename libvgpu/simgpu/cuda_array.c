/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_array.c - CUDA arrays: opaque device memory, charged but never mapped
 * (no host-visible pointer exists for an array, so nothing needs backing).
 */
#include <stdlib.h>

#include "../common/vg_array.h"
#include "cuda_internal.h"

struct sg_array {
    uint32_t magic;
    int dev;
    uint64_t bytes;
};

static CUresult array_create(void **out, uint32_t magic, uint64_t bytes)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes == UINT64_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sg_array *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->magic = magic;
    a->dev = c->dev;
    a->bytes = bytes;
    if (simgpu_mem_charge(sg_phys(a->dev), a->bytes) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (sg_handle_add(a) != 0) {
        simgpu_mem_uncharge(sg_phys(a->dev), a->bytes);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a;
    return CUDA_SUCCESS;
}

static CUresult array_destroy(void *handle, uint32_t magic)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_array *a = handle;
    if (!a || !sg_handle_take(a, magic))
        return CUDA_ERROR_INVALID_HANDLE;
    simgpu_mem_uncharge(sg_phys(a->dev), a->bytes);
    a->magic = SG_MAGIC_DEAD;
    free(a);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    if (!pAllocateArray)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
    return array_create((void **)pHandle, SG_MAGIC_ARRAY, vg_array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels, 1));
}

SIMGPU_API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    if (!pAllocateArray)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pAllocateArray;
    return array_create((void **)pHandle, SG_MAGIC_ARRAY,
                        vg_array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels, 1));
}

SIMGPU_API CUresult cuArrayDestroy(CUarray hArray)
{
    return array_destroy(hArray, SG_MAGIC_ARRAY);
}

SIMGPU_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                           unsigned int numMipmapLevels)
{
    if (!pMipmappedArrayDesc)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pMipmappedArrayDesc;
    return array_create((void **)pHandle, SG_MAGIC_MIPMAP,
                        vg_array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels, numMipmapLevels));
}

SIMGPU_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return array_destroy(hMipmappedArray, SG_MAGIC_MIPMAP);
}
