/* SPDX-License-Identifier: Apache-2.0 */
/*
 * simgpu_state.h - the shared state file that stands for the physical GPUs.
 *
 * Every process that maps the same SIMGPU_STATE file sees the same devices,
 * the same used memory (per-process slots, reclaimed by pid liveness) and one
 * execution engine per device: a timeline on which kernels from all processes
 * run one at a time in submission order.
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "../common/vg_slots.h"

#define SIMGPU_MAGIC 0x47504d53u /* "SMPG" */
#define SIMGPU_VERSION 1u
#define SIMGPU_MAX_DEVICES 16u
#define SIMGPU_SLOTS 256u
#define SIMGPU_RING 4096u /* recent kernel intervals per device, for utilisation */

struct simgpu_interval {
    _Atomic uint64_t start_ns; /* CLOCK_MONOTONIC */
    _Atomic uint64_t end_ns;
    _Atomic uint32_t pid;
    uint32_t pad;
};

struct simgpu_device {
    uint64_t total_bytes;
    char uuid[48];             /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    uint8_t uuid_bytes[16];
    char name[64];
    uint32_t pci_bus;
    uint32_t minor;
    _Atomic uint64_t tail_ns;      /* when the last submitted kernel finishes */
    _Atomic uint64_t busy_total_ns;/* all kernel time ever submitted */
    _Atomic uint64_t ring_head;    /* next interval to write (mod SIMGPU_RING) */
    struct simgpu_interval ring[SIMGPU_RING];
    _Atomic uint32_t slot_high_water;
    /* 1: the device fell off the bus: NVML calls on it return NVML_ERROR_GPU_IS_LOST.
     * Tests flip it at run time (simgpuDeviceSetLost, build/tests/simgpu_ctl). */
    _Atomic uint32_t lost;
    struct vg_slot slots[SIMGPU_SLOTS];
};

struct simgpu_state {
    uint32_t magic;    /* written last by the creator */
    uint32_t version;
    uint32_t size;     /* sizeof(struct simgpu_state) */
    uint32_t ndev;
    uint64_t created_ns;
    struct simgpu_device dev[SIMGPU_MAX_DEVICES];
};

/* Map the state file (SIMGPU_STATE, default /dev/shm/simgpu-<uid>.state),
 * creating it from SIMGPU_DEVICES when absent. Returns NULL and prints one
 * line on stderr on failure. Thread-safe; the mapping lives for the process. */
struct simgpu_state *simgpu_state(void);

/* CLOCK_MONOTONIC in ns. */
uint64_t simgpu_now_ns(void);

/* Charge/uncharge device memory for the calling process. 0 or -1 (out of memory). */
int simgpu_mem_charge(unsigned dev, uint64_t bytes);
void simgpu_mem_uncharge(unsigned dev, uint64_t bytes);
/* Live used memory of a device (reaps dead processes). */
uint64_t simgpu_mem_used(unsigned dev);

/* Put a kernel of dur_ns on device dev's engine after everything queued;
 * returns its end time. Records the interval for utilisation queries. */
uint64_t simgpu_engine_submit(unsigned dev, uint64_t dur_ns);
/* The waits of a sync for work that ends at t_ns. Each returns at t_ns, or, with
 * SIMGPU_WAKE_US=MIN-MAX, a random MIN..MAX us after it when it had to wait (a host's
 * wake-up latency); at once when t_ns has passed. */
/* Sleep (a CU_EVENT_BLOCKING_SYNC wait). */
void simgpu_wait_until(uint64_t t_ns);
/* Busy-wait (an event sync without CU_EVENT_BLOCKING_SYNC, as the driver does). */
void simgpu_spin_until(uint64_t t_ns);
/* A stream or context sync, as the driver's default (CU_CTX_SCHED_AUTO) does it with a
 * CPU to spare: it returns within a few us of its time, not a sleep's timer slack later. */
void simgpu_sync_until(uint64_t t_ns);
/* 0, or -1 after one line on stderr when SIMGPU_WAKE_US is malformed (cuInit refuses). */
int simgpu_wake_check(void);

#endif
