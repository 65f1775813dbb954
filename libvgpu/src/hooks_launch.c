/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hooks_launch.c - kernel and graph launches. Memory isolation needs nothing
 * here; the hooks exist so every launch path (direct, dlsym,
 * cuGetProcAddress, per-thread default stream) reaches one place, which is
 * where compute throttling attaches.
 */
#include "vgpu_internal.h"

VG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                                  void **extra)
{
    vg_boot();
    return REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

VG_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                       CUstream s, void **params, void **extra)
{
    vg_boot();
    return REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

VG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    vg_boot();
    return REAL(cuLaunchKernelEx)(config, f, params, extra);
}

VG_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    vg_boot();
    return REAL(cuLaunchKernelEx_ptsz)(config, f, params, extra);
}

VG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                             CUstream s, void **params)
{
    vg_boot();
    return REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

VG_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz,
                                                  unsigned int shmem, CUstream s, void **params)
{
    vg_boot();
    return REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

VG_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    vg_boot();
    return REAL(cuGraphLaunch)(exec, s);
}

VG_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
    vg_boot();
    return REAL(cuGraphLaunch_ptsz)(exec, s);
}
