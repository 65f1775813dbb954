/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_device.c - initialisation, entry-point lookup, and the devices and
 * memory as the slice sees them: total = the slice's limit, used = the
 * slice's usage. Reporting never returns an error the real call would not.
 */
#include <stdio.h>

#include "vgpu_internal.h"

void vg_format_uuid(const CUuuid *u, char *out, size_t len)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

VG_EXPORT CUresult cuInit(unsigned int flags)
{
    vg_boot();
    if (vg_cfg.error[0] || (atomic_load(&vg_active) && vg_procaddr_check() != 0))
        return vg_fail_closed();
    CUresult r = REAL(cuInit)(flags);
    if (r != CUDA_SUCCESS || !atomic_load(&vg_active))
        return r;
    return vg_ready();
}

VG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    vg_boot();
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = vg_translate(*pfn);
    return r;
}

VG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    vg_boot();
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = vg_translate(*pfn);
    return r;
}

/* A slice made by the arbiter covers only its own devices (/dev/vgpu<i>). */
VG_EXPORT CUresult cuDeviceGetCount(int *count)
{
    VG_PASSTHROUGH_IF_INERT(cuDeviceGetCount, count);
    CUresult r = REAL(cuDeviceGetCount)(count);
    if (r == CUDA_SUCCESS && vg_cfg.mode == VG_MODE_SLICE && *count > (int)vg_cfg.slice_devices)
        *count = (int)vg_cfg.slice_devices;
    return r;
}

VG_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    VG_PASSTHROUGH_IF_INERT(cuDeviceGet, device, ordinal);
    if (vg_cfg.mode == VG_MODE_SLICE && ordinal >= (int)vg_cfg.slice_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    return REAL(cuDeviceGet)(device, ordinal);
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

VG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    VG_PASSTHROUGH_IF_INERT(cuDeviceTotalMem_v2, bytes, dev);
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && vg_ready() == CUDA_SUCCESS && vg_region(dev))
        *bytes = (size_t)min_u64(vg_limit(dev), *bytes);
    return r;
}

VG_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    VG_PASSTHROUGH_IF_INERT(cuMemGetInfo_v2, free, total);
    CUresult r = REAL(cuMemGetInfo_v2)(free, total);
    int dev = vg_current_device();
    if (r != CUDA_SUCCESS || !free || !total || vg_ready() != CUDA_SUCCESS || !vg_region(dev))
        return r;
    uint64_t t = min_u64(vg_limit(dev), *total);
    vg_pools_reconcile(dev, 0); /* what pools hold counts, as the driver reports it now */
    uint64_t used = vg_used(dev);
    *total = (size_t)t;
    /* The physical GPU may have less free than the slice (others use it too). */
    *free = (size_t)(used >= t ? 0 : min_u64(t - used, *free));
    return r;
}
