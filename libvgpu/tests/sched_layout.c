/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sched_layout - print the scheduling file layouts as JSON: size and alignment
 * of struct vgpu_sched, vgpu_sched_entry and vgpu_sched_req, [offset, size] of
 * every field, and the constants. tests/test_sched_layout.py compares it with
 * arbiter/sched.py.
 */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

#include "vgpu_sched.h"

#define FIELD(type, name, last)                                                                    \
    printf("      \"%s\": [%zu, %zu]%s\n", #name, offsetof(type, name),                           \
           sizeof(((type *)0)->name), (last) ? "" : ",")

#define STRUCT(name)                                                                               \
    printf("  \"%s\": {\n    \"size\": %zu,\n    \"align\": %zu,\n    \"fields\": {\n", #name,  \
           sizeof(struct name), alignof(struct name))

int main(void)
{
    printf("{\n");
    STRUCT(vgpu_sched);
    FIELD(struct vgpu_sched, magic, 0);
    FIELD(struct vgpu_sched, version, 0);
    FIELD(struct vgpu_sched, size, 0);
    FIELD(struct vgpu_sched, entry_capacity, 0);
    FIELD(struct vgpu_sched, uuid, 0);
    FIELD(struct vgpu_sched, grant, 0);
    FIELD(struct vgpu_sched, doorbell, 0);
    FIELD(struct vgpu_sched, grant_ns, 0);
    FIELD(struct vgpu_sched, broker_beat_ns, 0);
    FIELD(struct vgpu_sched, broker_pid, 0);
    FIELD(struct vgpu_sched, contended, 0);
    FIELD(struct vgpu_sched, present, 0);
    FIELD(struct vgpu_sched, active_mask, 0);
    FIELD(struct vgpu_sched, handoffs, 0);
    FIELD(struct vgpu_sched, revocations, 0);
    FIELD(struct vgpu_sched, active, 0);
    FIELD(struct vgpu_sched, broker_epoch, 0);
    FIELD(struct vgpu_sched, reserved, 0);
    FIELD(struct vgpu_sched, entries, 1);
    printf("    }\n  },\n");
    STRUCT(vgpu_sched_entry);
    FIELD(struct vgpu_sched_entry, key, 0);
    FIELD(struct vgpu_sched_entry, share, 0);
    FIELD(struct vgpu_sched_entry, priority, 0);
    FIELD(struct vgpu_sched_entry, policy, 0);
    FIELD(struct vgpu_sched_entry, floor, 0);
    FIELD(struct vgpu_sched_entry, credit_ns, 0);
    FIELD(struct vgpu_sched_entry, used_ns, 0);
    FIELD(struct vgpu_sched_entry, last_active_ns, 0);
    FIELD(struct vgpu_sched_entry, waiting, 0);
    FIELD(struct vgpu_sched_entry, holds, 0);
    FIELD(struct vgpu_sched_entry, registered_ns, 0);
    FIELD(struct vgpu_sched_entry, reserved, 1);
    printf("    }\n  },\n");
    STRUCT(vgpu_sched_req);
    FIELD(struct vgpu_sched_req, magic, 0);
    FIELD(struct vgpu_sched_req, version, 0);
    FIELD(struct vgpu_sched_req, size, 0);
    FIELD(struct vgpu_sched_req, pad, 0);
    FIELD(struct vgpu_sched_req, key, 0);
    FIELD(struct vgpu_sched_req, share, 0);
    FIELD(struct vgpu_sched_req, priority, 0);
    FIELD(struct vgpu_sched_req, policy, 0);
    FIELD(struct vgpu_sched_req, floor, 0);
    FIELD(struct vgpu_sched_req, want, 0);
    FIELD(struct vgpu_sched_req, owner, 0);
    FIELD(struct vgpu_sched_req, want_ns, 0);
    FIELD(struct vgpu_sched_req, owner_seq, 0);
    FIELD(struct vgpu_sched_req, release_seq, 0);
    FIELD(struct vgpu_sched_req, release_ns, 0);
    FIELD(struct vgpu_sched_req, drain_seq, 0);
    FIELD(struct vgpu_sched_req, pad2, 0);
    FIELD(struct vgpu_sched_req, drain_ns, 0);
    FIELD(struct vgpu_sched_req, idle_ns, 0);
    FIELD(struct vgpu_sched_req, active_ns, 0);
    FIELD(struct vgpu_sched_req, idle_since, 0);
    FIELD(struct vgpu_sched_req, reserved, 1);
    printf("    }\n  },\n");
    printf("  \"constants\": {\n");
    printf("    \"SCHED_MAGIC\": %u,\n", VGPU_SCHED_MAGIC);
    printf("    \"SCHED_REQ_MAGIC\": %u,\n", VGPU_SCHED_REQ_MAGIC);
    printf("    \"SCHED_VERSION\": %u,\n", VGPU_SCHED_VERSION);
    printf("    \"SCHED_ENTRIES\": %u,\n", VGPU_SCHED_ENTRIES);
    printf("    \"SCHED_UUID_LEN\": %u\n", VGPU_SCHED_UUID_LEN);
    printf("  }\n}\n");
    return 0;
}
