/* SPDX-License-Identifier: Apache-2.0 */
/*
 * region_layout - print the region file layout as JSON: size and alignment of
 * struct vgpu_region and struct vg_slot, [offset, size] of every field, and the
 * constants. tests/test_region_layout.py compares it with arbiter/region.py.
 */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

#include "vgpu_region.h"

#define FIELD(type, name, last)                                                                    \
    printf("      \"%s\": [%zu, %zu]%s\n", #name, offsetof(type, name),                           \
           sizeof(((type *)0)->name), (last) ? "" : ",")

int main(void)
{
    printf("{\n");
    printf("  \"vgpu_region\": {\n    \"size\": %zu,\n    \"align\": %zu,\n    \"fields\": {\n",
           sizeof(struct vgpu_region), alignof(struct vgpu_region));
    FIELD(struct vgpu_region, magic, 0);
    FIELD(struct vgpu_region, version, 0);
    FIELD(struct vgpu_region, size, 0);
    FIELD(struct vgpu_region, flags, 0);
    FIELD(struct vgpu_region, uuid, 0);
    FIELD(struct vgpu_region, device_index, 0);
    FIELD(struct vgpu_region, slot_capacity, 0);
    FIELD(struct vgpu_region, memory_limit, 0);
    FIELD(struct vgpu_region, context_reserve, 0);
    FIELD(struct vgpu_region, compute_share, 0);
    FIELD(struct vgpu_region, priority, 0);
    FIELD(struct vgpu_region, policy, 0);
    FIELD(struct vgpu_region, priority_floor, 0);
    FIELD(struct vgpu_region, generation, 0);
    FIELD(struct vgpu_region, reserved_hw, 0);
    FIELD(struct vgpu_region, reserved32, 0);
    FIELD(struct vgpu_region, slice_key, 0);
    FIELD(struct vgpu_region, reserved, 1);
    printf("    }\n  },\n");
    printf("  \"vgpu_usage\": {\n    \"size\": %zu,\n    \"align\": %zu,\n    \"fields\": {\n",
           sizeof(struct vgpu_usage), alignof(struct vgpu_usage));
    FIELD(struct vgpu_usage, magic, 0);
    FIELD(struct vgpu_usage, version, 0);
    FIELD(struct vgpu_usage, size, 0);
    FIELD(struct vgpu_usage, slot_capacity, 0);
    FIELD(struct vgpu_usage, slot_high_water, 0);
    FIELD(struct vgpu_usage, reserved32, 0);
    FIELD(struct vgpu_usage, reserved, 0);
    FIELD(struct vgpu_usage, slots, 1);
    printf("    }\n  },\n");
    printf("  \"vg_slot\": {\n    \"size\": %zu,\n    \"align\": %zu,\n    \"fields\": {\n",
           sizeof(struct vg_slot), alignof(struct vg_slot));
    FIELD(struct vg_slot, pid, 0);
    FIELD(struct vg_slot, flags, 0);
    FIELD(struct vg_slot, start_time, 0);
    FIELD(struct vg_slot, used, 0);
    FIELD(struct vg_slot, busy_ns, 0);
    FIELD(struct vg_slot, last_active_ns, 0);
    FIELD(struct vg_slot, pid_ns, 0);
    FIELD(struct vg_slot, reserved, 1);
    printf("    }\n  },\n");
    printf("  \"constants\": {\n");
    printf("    \"REGION_MAGIC\": %u,\n", VGPU_REGION_MAGIC);
    printf("    \"USAGE_MAGIC\": %u,\n", VGPU_USAGE_MAGIC);
    printf("    \"REGION_VERSION\": %u,\n", VGPU_REGION_VERSION);
    printf("    \"REGION_SLOTS\": %u,\n", VGPU_REGION_SLOTS);
    printf("    \"REGION_UUID_LEN\": %u,\n", VGPU_REGION_UUID_LEN);
    printf("    \"FLAG_ARBITER\": %u,\n", VGPU_REGION_FLAG_ARBITER);
    printf("    \"SLOT_REAPING\": %u,\n", VG_SLOT_REAPING);
    printf("    \"PRIORITY_LOW\": %d,\n", VGPU_PRIORITY_LOW);
    printf("    \"PRIORITY_NORMAL\": %d,\n", VGPU_PRIORITY_NORMAL);
    printf("    \"PRIORITY_HIGH\": %d,\n", VGPU_PRIORITY_HIGH);
    printf("    \"POLICY_FIXED\": %d,\n", VGPU_POLICY_FIXED);
    printf("    \"POLICY_BURST\": %d\n", VGPU_POLICY_BURST);
    printf("  }\n}\n");
    return 0;
}
