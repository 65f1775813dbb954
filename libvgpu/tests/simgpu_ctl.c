/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_ctl - flips what simgpu simulates, for tests and demos, on the state
 * file SIMGPU_STATE names:
 *
 *   simgpu_ctl lose INDEX      device INDEX fell off the bus (NVML: GPU is lost)
 *   simgpu_ctl restore INDEX   it is back
 *
 * Exit 0, or 1 with one line on stderr; 2 for a usage error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_cuda.h"

/* simgpu's own export (libvgpu/simgpu/nvml_device.c), not part of NVML. */
nvmlReturn_t simgpuDeviceSetLost(unsigned int index, int lost);

int main(int argc, char **argv)
{
    char *end = NULL;
    unsigned long index = argc == 3 ? strtoul(argv[2], &end, 10) : 0;
    int lose = argc == 3 && strcmp(argv[1], "lose") == 0;
    if (argc != 3 || (!lose && strcmp(argv[1], "restore") != 0) || !*argv[2] || *end) {
        fprintf(stderr, "usage: simgpu_ctl lose|restore INDEX\n");
        return 2;
    }
    nvmlReturn_t rc = simgpuDeviceSetLost((unsigned)index, lose);
    if (rc != NVML_SUCCESS) {
        fprintf(stderr, "simgpu_ctl: %s %lu: %s\n", argv[1], index, nvmlErrorString(rc));
        return 1;
    }
    return 0;
}
