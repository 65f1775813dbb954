/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvml_internal.h - shared by simgpu's NVML files (nvml_*.c): init state,
 * handle validation and the engine-ring arithmetic behind utilisation.
 */
#ifndef SIMGPU_NVML_INTERNAL_H
#define SIMGPU_NVML_INTERNAL_H

#include <stdint.h>

#include "simgpu_api.h"
#include "simgpu_state.h"
#include "../include/vgpu_cuda.h"

/* What an nvmlDevice_t points at: one per device, in a static table that the
 * library owns, so a handle never points into the shared file and can be
 * checked by address before it is dereferenced. */
struct nvmlDevice_st {
    unsigned index;
};

/* Utilisation is measured over this window, like NVML's sample period (1/6 s .. 1 s). */
#define NVML_SIM_WINDOW_NS 1000000000ull

/* 1 between nvmlInit* and the matching nvmlShutdown. */
int vg_nvml_ready(void);
/* The mapped state once initialised (NULL before). */
struct simgpu_state *vg_nvml_state(void);
/* The handle of device i (i < ndev). */
nvmlDevice_t vg_nvml_handle(unsigned i);
/* Check init and a handle: NVML_SUCCESS and *dev set, else the error to return
 * (NVML_ERROR_GPU_IS_LOST for a device marked lost). */
nvmlReturn_t vg_nvml_device(nvmlDevice_t h, struct simgpu_device **dev, unsigned *index);
/* Copy a NUL-terminated string into a caller buffer of length len:
 * NVML_ERROR_INVALID_ARGUMENT for NULL, NVML_ERROR_INSUFFICIENT_SIZE when short. */
nvmlReturn_t vg_nvml_copy_str(char *dst, unsigned len, const char *src);

/* Kernel time on dev's engine inside [from_ns, to_ns]; pid 0 = all processes. */
uint64_t vg_nvml_busy_ns(struct simgpu_device *dev, uint64_t from_ns, uint64_t to_ns, uint32_t pid);
/* Device utilisation (0..100) over the last window. */
unsigned vg_nvml_gpu_percent(struct simgpu_device *dev);
/* A plausible memory-controller utilisation for a given SM utilisation:
 * simgpu kernels only occupy time, so memory traffic is modelled as a fixed share. */
unsigned vg_nvml_mem_percent(unsigned gpu_percent);

#endif
