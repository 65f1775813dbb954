/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_timeline - print the recent kernels of one simulated device, oldest
 * first: "start_ns end_ns pid" per line (CLOCK_MONOTONIC), from simgpu's
 * state file. bench/compute.py reads the GPU's idle time at hand-overs in it.
 * On the timed engine (docs/simgpu.md) a line is a run of a kernel: one that was
 * preempted has several, and the one in progress ends where the engine was last
 * worked out (this program reads the file without working it out). The ring keeps the
 * last SIMGPU_RING runs: when older ones were overwritten, stderr says how many, so a
 * reader knows the timeline starts later than the device's first kernel.
 *
 *   simgpu_timeline STATE_FILE [DEVICE]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../simgpu/simgpu_state.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: simgpu_timeline STATE_FILE [DEVICE]\n");
        return 2;
    }
    unsigned dev = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    int fd = open(argv[1], O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(struct simgpu_state)) {
        perror(argv[1]);
        return 1;
    }
    const struct simgpu_state *st = mmap(NULL, sizeof(*st), PROT_READ, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED || st->magic != SIMGPU_MAGIC || dev >= st->ndev) {
        fprintf(stderr, "simgpu_timeline: %s: not a simgpu state file with device %u\n", argv[1], dev);
        return 1;
    }
    const struct simgpu_device *d = &st->dev[dev];
    uint64_t head = atomic_load(&d->ring_head);
    uint64_t n = head < SIMGPU_RING ? head : SIMGPU_RING;
    if (head > n)
        fprintf(stderr, "simgpu_timeline: %llu older runs overwritten\n", (unsigned long long)(head - n));
    for (uint64_t k = head - n; k < head; k++) {
        const struct simgpu_interval *iv = &d->ring[k % SIMGPU_RING];
        printf("%llu %llu %u\n", (unsigned long long)atomic_load(&iv->start_ns),
               (unsigned long long)atomic_load(&iv->end_ns), (unsigned)atomic_load(&iv->pid));
    }
    return 0;
}
