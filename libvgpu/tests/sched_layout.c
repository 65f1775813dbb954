/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sched_layout - print the scheduling region layout as JSON: size and alignment
 * of struct vgpu_sched and struct vgpu_sched_entry, [offset, size] of every
 * field, and the constants. tests/test_sched_layout.py compares it with
 * arbiter/sched.py.
 */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

#include "vgpu_sched.h"

#define FIELD(type, name, last)                                                                    \
    printf("      \"%s\": [%zu, %zu]%s\n", #name, offsetof(type, name),                           \
           sizeof(((type *)0)->name), (last) ? "" : ",")

int main(void)
{
    printf("{\n");
    printf("  \"vgpu_sched\": {\n    \"size\": %zu,\n    \"align\": %zu,\n    \"fields\": {\n",
           sizeof(struct vgpu_sched), alignof(struct vgpu_sched));
    FIELD(struct vgpu_sched, magic, 0);
    FIELD(struct vgpu_sched, version, 0);
    FIELD(struct vgpu_sched, size, 0);
    FIELD(struct vgpu_sched, entry_capacity, 0);
    FIELD(struct vgpu_sched, uuid, 0);
    FIELD(struct vgpu_sched, token, 0);
    FIELD(struct vgpu_sched, token_entry, 0);
    FIELD(struct vgpu_sched, token_since_ns, 0);
    FIELD(struct vgpu_sched, token_lease_ns, 0);
    FIELD(struct vgpu_sched, token_pid, 0);
    FIELD(struct vgpu_sched, token_seq, 0);
    FIELD(struct vgpu_sched, prio_active_ns, 0);
    FIELD(struct vgpu_sched, handoffs, 0);
    FIELD(struct vgpu_sched, drain_token, 0);
    FIELD(struct vgpu_sched, pad, 0);
    FIELD(struct vgpu_sched, drain_ns, 0);
    FIELD(struct vgpu_sched, prio_mask, 0);
    FIELD(struct vgpu_sched, pad2, 0);
    FIELD(struct vgpu_sched, reserved, 0);
    FIELD(struct vgpu_sched, entries, 1);
    printf("    }\n  },\n");
    printf("  \"vgpu_sched_entry\": {\n    \"size\": %zu,\n    \"align\": %zu,\n"
           "    \"fields\": {\n",
           sizeof(struct vgpu_sched_entry), alignof(struct vgpu_sched_entry));
    FIELD(struct vgpu_sched_entry, key, 0);
    FIELD(struct vgpu_sched_entry, share, 0);
    FIELD(struct vgpu_sched_entry, priority, 0);
    FIELD(struct vgpu_sched_entry, policy, 0);
    FIELD(struct vgpu_sched_entry, floor, 0);
    FIELD(struct vgpu_sched_entry, budget_ns, 0);
    FIELD(struct vgpu_sched_entry, budget_ts, 0);
    FIELD(struct vgpu_sched_entry, floor_budget_ns, 0);
    FIELD(struct vgpu_sched_entry, used_ns, 0);
    FIELD(struct vgpu_sched_entry, last_active_ns, 0);
    FIELD(struct vgpu_sched_entry, waiting, 0);
    FIELD(struct vgpu_sched_entry, holds, 0);
    FIELD(struct vgpu_sched_entry, wait_heartbeat_ns, 0);
    FIELD(struct vgpu_sched_entry, reserved, 1);
    printf("    }\n  },\n");
    printf("  \"constants\": {\n");
    printf("    \"SCHED_MAGIC\": %u,\n", VGPU_SCHED_MAGIC);
    printf("    \"SCHED_VERSION\": %u,\n", VGPU_SCHED_VERSION);
    printf("    \"SCHED_ENTRIES\": %u,\n", VGPU_SCHED_ENTRIES);
    printf("    \"SCHED_UUID_LEN\": %u\n", VGPU_SCHED_UUID_LEN);
    printf("  }\n}\n");
    return 0;
}
