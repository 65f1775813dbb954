/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_region.h - a slice's files: per vGPU, its limits and its usage.
 *
 * The arbiter creates, per vGPU, /run/vgpu/slices/<id>/vgpu<i> (struct
 * vgpu_region: limits and identity; the hook mounts it read-only as
 * /dev/vgpu<i>) and vgpu<i>.usage (struct vgpu_usage: one slot per process,
 * written by libvgpu; mounted read-write as /dev/vgpu<i>.usage). A container
 * can write only its own usage; what it writes there is never trusted for
 * limits, identity or whom to act on. The arbiter may change limits in place:
 * running processes read them on every check. Standalone, libvgpu creates
 * both files in <VGPU_REGION_DIR> itself from the environment.
 *
 * This layout is a contract: arbiter/files/region_file.py mirrors it with ctypes and
 * tests/arbiter/files/test_region_file.py proves that sizes and offsets agree. Any change
 * bumps VGPU_REGION_VERSION.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdint.h>

#include "../common/vg_slots.h"
#include "vgpu_checks.h"

#define VGPU_REGION_MAGIC 0x55504756u /* "VGPU" little-endian */
#define VGPU_USAGE_MAGIC 0x53554756u  /* "VGUS" little-endian */
#define VGPU_REGION_VERSION 2u /* 2: usage slots in their own file */
#define VGPU_REGION_SLOTS 1024u
#define VGPU_REGION_UUID_LEN 96u

enum vgpu_priority { VGPU_PRIORITY_LOW = 0, VGPU_PRIORITY_NORMAL = 1, VGPU_PRIORITY_HIGH = 2 };
enum vgpu_policy { VGPU_POLICY_FIXED = 0, VGPU_POLICY_BURST = 1 };

/* A slice's files, vgpu<i> and vgpu<i>.usage, in its region dir (the hook mounts them
 * as /dev/vgpu<i>): arbiter.files.slice_dirs.region_name and
 * arbiter.files.region_file.USAGE_SUFFIX are the Python twins
 * (tests/project/test_constants.py). */
#define VGPU_REGION_FILE_PREFIX "vgpu"
#define VGPU_USAGE_SUFFIX ".usage"
/* Standalone (no arbiter): the directory of shared region files (`vgpu run` sets it;
 * arbiter.defaults.ENV_REGION_DIR). */
#define VGPU_ENV_REGION_DIR "VGPU_REGION_DIR"

/* flags */
#define VGPU_REGION_FLAG_ARBITER 0x1u /* made by vgpud: env vars never override it */

struct vgpu_region {
    uint32_t magic;       /* VGPU_REGION_MAGIC, written last when the file is made */
    uint32_t version;     /* VGPU_REGION_VERSION */
    uint32_t size;        /* sizeof(struct vgpu_region) */
    uint32_t flags;       /* VGPU_REGION_FLAG_* */
    char uuid[VGPU_REGION_UUID_LEN]; /* physical GPU UUID ("GPU-..."), "" = by ordinal */
    uint32_t device_index;           /* physical GPU index (informational) */
    uint32_t slot_capacity;          /* VGPU_REGION_SLOTS: the usage file's */
    _Atomic uint64_t memory_limit;   /* bytes the slice may hold on this GPU */
    _Atomic uint64_t context_reserve;/* bytes charged per CUDA context a process creates */
    _Atomic uint32_t compute_share;  /* percent, 2..100 */
    _Atomic uint32_t priority;       /* enum vgpu_priority */
    _Atomic uint32_t policy;         /* enum vgpu_policy */
    _Atomic uint32_t priority_floor; /* percent a lower priority keeps while preempted */
    _Atomic uint64_t generation;     /* bumped by the arbiter on every limit change */
    uint32_t reserved_hw;            /* (version 1's slot high water) */
    uint32_t reserved32;
    _Atomic uint64_t slice_key;      /* random, set by the creator: names the slice in the
                                      * GPU's scheduling region (vgpu_sched.h); 0 = none */
    uint64_t reserved[23];           /* room for later fields without a version bump */
};

/* Written by the slice's processes (each in its own slot): read by everyone else
 * as untrusted, bounds-checked data. */
struct vgpu_usage {
    uint32_t magic;                  /* VGPU_USAGE_MAGIC, written last when the file is made */
    uint32_t version;                /* VGPU_REGION_VERSION */
    uint32_t size;                   /* sizeof(struct vgpu_usage) */
    uint32_t slot_capacity;          /* VGPU_REGION_SLOTS */
    _Atomic uint32_t slot_high_water;/* slots [0, high_water) have been used */
    uint32_t reserved32;
    uint64_t reserved[5];
    struct vg_slot slots[VGPU_REGION_SLOTS];
};

/* What a reader checks before it trusts each file, field and value, and what its
 * creator writes there: the one list of these rules (vgpu_checks.h;
 * arbiter/files/header_checks.py keeps it as data). A creator writes the fields of
 * *_FIELDS first and magic last, so a file still being made fails the first check. */
#define VGPU_REGION_FIELDS(X)                                                          \
    X(version, VGPU_REGION_VERSION)                                                    \
    X(size, sizeof(struct vgpu_region))                                                \
    X(slot_capacity, VGPU_REGION_SLOTS)
#define VGPU_REGION_CHECKS(X) X(magic, VGPU_REGION_MAGIC) VGPU_REGION_FIELDS(X)
#define VGPU_USAGE_FIELDS(X)                                                           \
    X(version, VGPU_REGION_VERSION)                                                    \
    X(size, sizeof(struct vgpu_usage))                                                 \
    X(slot_capacity, VGPU_REGION_SLOTS)
#define VGPU_USAGE_CHECKS(X) X(magic, VGPU_USAGE_MAGIC) VGPU_USAGE_FIELDS(X)

VG_DEFINE_CHECK(vgpu_region_check, struct vgpu_region, VGPU_REGION_CHECKS)
VG_DEFINE_CHECK(vgpu_usage_check, struct vgpu_usage, VGPU_USAGE_CHECKS)
VG_DEFINE_INIT(vgpu_region_init, struct vgpu_region, VGPU_REGION_FIELDS)
VG_DEFINE_INIT(vgpu_usage_init, struct vgpu_usage, VGPU_USAGE_FIELDS)

#endif
