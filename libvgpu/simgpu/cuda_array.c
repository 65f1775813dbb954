/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_array.c - CUDA arrays: opaque device memory, charged but never mapped
 * (no host-visible pointer exists for an array, so nothing needs backing).
 */
#include <stdlib.h>

#include "cuda_internal.h"

struct sg_array {
    uint32_t magic;
    int dev;
    uint64_t bytes;
};

static unsigned format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

static CUresult array_create(CUarray *out, size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned fb = format_bytes(f);
    if (!out || w == 0 || fb == 0 || (ch != 1 && ch != 2 && ch != 4))
        return CUDA_ERROR_INVALID_VALUE;
    h = h ? h : 1;
    d = d ? d : 1;
    /* Overflow-safe product: anything past 2^63 bytes cannot fit a device anyway. */
    unsigned __int128 b = (unsigned __int128)w * h * d * ch * fb;
    if (b >> 63)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sg_array *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->magic = SG_MAGIC_ARRAY;
    a->dev = c->dev;
    a->bytes = (uint64_t)b;
    if (simgpu_mem_charge((unsigned)a->dev, a->bytes) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (sg_handle_add(a) != 0) {
        simgpu_mem_uncharge((unsigned)a->dev, a->bytes);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUarray)a;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    if (!pAllocateArray)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
    return array_create(pHandle, a->Width, a->Height, 1, a->Format, a->NumChannels);
}

SIMGPU_API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    if (!pAllocateArray)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pAllocateArray;
    return array_create(pHandle, a->Width, a->Height, a->Depth, a->Format, a->NumChannels);
}

SIMGPU_API CUresult cuArrayDestroy(CUarray hArray)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_array *a = (struct sg_array *)hArray;
    if (!a || !sg_handle_take(a, SG_MAGIC_ARRAY))
        return CUDA_ERROR_INVALID_HANDLE;
    simgpu_mem_uncharge((unsigned)a->dev, a->bytes);
    a->magic = SG_MAGIC_DEAD;
    free(a);
    return CUDA_SUCCESS;
}
