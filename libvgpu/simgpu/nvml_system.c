/* SPDX-License-Identifier: Apache-2.0 */
/* nvml_system.c - system-wide queries: driver/NVML/CUDA versions and the device count. */
#include "nvml_internal.h"

#include <ctype.h>
#include <stdlib.h>

/* Shaped like a real driver version ("major.minor.patch", all numeric) because
 * clients parse it (int(v.split(".")[0]) and version tuples); the device name
 * ("NVIDIA SimGPU ...") is what tells a simulated GPU apart. */
#define SIMGPU_DRIVER_VERSION "580.95.05"
#define SIMGPU_NVML_VERSION "13." SIMGPU_DRIVER_VERSION
#define SIMGPU_CUDA_VERSION 13000
/* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: the longest answer a client must take. */
#define SIMGPU_DRIVER_VERSION_MAX 80

/* The driver version: SIMGPU_DRIVER_VERSION from the environment (tests of what a
 * client shows, e.g. `vgpu devices`) when it is shaped like one (digits and dots, at
 * most 79 characters), else the built-in one. Read at each call: no state. */
static const char *sg_driver_version(void)
{
    const char *v = getenv("SIMGPU_DRIVER_VERSION");
    size_t n = 0;
    if (!v || !*v)
        return SIMGPU_DRIVER_VERSION;
    for (; v[n]; n++) {
        if (n + 1 >= SIMGPU_DRIVER_VERSION_MAX || !(isdigit((unsigned char)v[n]) || v[n] == '.'))
            return SIMGPU_DRIVER_VERSION;
    }
    return v;
}

SIMGPU_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!vg_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    return vg_nvml_copy_str(version, length, sg_driver_version());
}

SIMGPU_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    /* The real one answers before nvmlInit too: it describes the library. */
    return vg_nvml_copy_str(version, length, SIMGPU_NVML_VERSION);
}

SIMGPU_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!vg_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = SIMGPU_CUDA_VERSION;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    struct simgpu_state *st = vg_nvml_state();
    if (!st)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = st->ndev;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}
