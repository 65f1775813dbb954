/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.h - the token broker of one GPU (vgpu_sched.h; DESIGN.md "Compute
 * between tenants"). It decides who may submit work to the GPU and charges
 * each slice by its own clock. It runs in the vgpu-broker process (vgpud's,
 * one thread per GPU file) or, standalone, as a thread of one of the slices'
 * processes. It depends on nothing else of libvgpu but its rules, policy.c
 * (pure: broker.c is the I/O around them).
 */
#ifndef VG_BROKER_H
#define VG_BROKER_H

#include <stdint.h>

#include "../include/vgpu_sched.h"

struct vg_bgpu;

/* Serve the per-GPU file at path (dir/<uuid>), whose slices' .req (and, with
 * confs set, .conf) files are beside it. confs: settings come only from
 * vgpud's .conf files (a slice without one is not served); otherwise from
 * each .req (standalone). NULL with *why set on failure. */
struct vg_bgpu *vg_bgpu_open(const char *path, int confs, const char **why);

/* Take the lock that says who serves the GPU file open at gpu_fd (its path: path):
 * the fd that holds it (close it to let go), or -1 with errno EAGAIN while another
 * broker holds it (other errnos: it cannot be taken at all). The lock lives in
 * VGPU_BROKER_LOCK_NAME beside the GPU file, never on the GPU file itself: every
 * container of the GPU has that file mounted, and flock, a read lock or a lease work
 * on a read-only fd, so a tenant could hold the lock when a broker restarts and keep
 * every slice of the GPU from being granted. Never blocks. */
int vg_broker_lock(int gpu_fd, const char *path);

/* Serve an anonymous scheduling region (one process alone): its one slice
 * posts in req. */
struct vg_bgpu *vg_bgpu_private(struct vgpu_sched *s, struct vgpu_sched_req *req, uint64_t key);

/* Serve until *stop becomes nonzero or another broker starts on the same file
 * (checked at least every 10 ms). */
void vg_bgpu_run(struct vg_bgpu *g, volatile int *stop);

/* Sleep on a process-shared futex word while it holds val, at most ns (a wait only
 * reads the word: a read-only mapping will do). */
void vg_futex_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns);

/* Ring the broker's doorbell after writing a request (any party; needs only
 * read access to the mapping: a futex wake writes nothing). */
void vg_broker_ring(struct vgpu_sched *s);

/* Whether the per-GPU region header is whole and of this version. */
int vg_sched_header_ok(const struct vgpu_sched *s);

/* CLOCK_MONOTONIC ns. */
uint64_t vg_broker_now(void);

#endif
