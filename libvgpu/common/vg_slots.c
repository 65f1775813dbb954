/* SPDX-License-Identifier: Apache-2.0 */
/* vg_slots.c - lock-free per-process accounting; see vg_slots.h. */
#include "vg_slots.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t vg_proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* comm may contain spaces and parentheses: fields restart after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    /* After ") " comes field 3 (state); starttime is field 22. */
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return strtoull(p, NULL, 10);
}

int vg_pid_alive(uint32_t pid, uint64_t start_time)
{
    if (pid == 0 || (pid & VG_SLOT_REAPING))
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return 0;
    if (start_time == 0)
        return 1;
    uint64_t now = vg_proc_start_time((pid_t)pid);
    /* /proc may be unreadable (hidepid); then trust kill(). */
    return now == 0 || now == start_time;
}

static void slot_clear(struct vg_slot *s, uint32_t marker)
{
    atomic_store(&s->used, 0);
    atomic_store(&s->busy_ns, 0);
    atomic_store(&s->last_active_ns, 0);
    atomic_store(&s->start_time, 0);
    uint32_t expect = marker;
    atomic_compare_exchange_strong(&s->pid, &expect, 0);
}

static void slot_take(struct vg_slot *s, uint32_t me, uint64_t start)
{
    atomic_store(&s->used, 0);
    atomic_store(&s->busy_ns, 0);
    atomic_store(&s->last_active_ns, 0);
    atomic_store(&s->start_time, start);
    (void)me;
}

unsigned vg_slots_reap(struct vg_slot *slots, _Atomic uint32_t *high_water)
{
    uint32_t hw = atomic_load(high_water);
    uint32_t marker = VG_SLOT_REAPING | (uint32_t)getpid();
    unsigned freed = 0;
    for (uint32_t i = 0; i < hw; i++) {
        struct vg_slot *s = &slots[i];
        uint32_t pid = atomic_load(&s->pid);
        if (pid == 0)
            continue;
        if (pid & VG_SLOT_REAPING) {
            /* A reaper that died half-way: finish its job. */
            if (vg_pid_alive(pid & ~VG_SLOT_REAPING, 0))
                continue;
        } else if (vg_pid_alive(pid, atomic_load(&s->start_time))) {
            continue;
        }
        if (atomic_compare_exchange_strong(&s->pid, &pid, marker)) {
            slot_clear(s, marker);
            freed++;
        }
    }
    return freed;
}

int vg_slots_claim(struct vg_slot *slots, uint32_t capacity, _Atomic uint32_t *high_water)
{
    uint32_t me = (uint32_t)getpid();
    uint64_t start = vg_proc_start_time((pid_t)me);
    for (int pass = 0; pass < 2; pass++) {
        uint32_t hw = atomic_load(high_water);
        /* Our own slot from before an exec: the old image's memory died with it. */
        for (uint32_t i = 0; i < hw; i++) {
            if (atomic_load(&slots[i].pid) == me) {
                slot_take(&slots[i], me, start);
                return (int)i;
            }
        }
        for (uint32_t i = 0; i < hw; i++) {
            uint32_t expect = 0;
            if (atomic_compare_exchange_strong(&slots[i].pid, &expect, me)) {
                slot_take(&slots[i], me, start);
                return (int)i;
            }
        }
        while (hw < capacity) {
            if (atomic_compare_exchange_weak(high_water, &hw, hw + 1)) {
                uint32_t expect = 0;
                if (atomic_compare_exchange_strong(&slots[hw].pid, &expect, me)) {
                    slot_take(&slots[hw], me, start);
                    return (int)hw;
                }
                hw = atomic_load(high_water);
            }
        }
        if (vg_slots_reap(slots, high_water) == 0)
            break;
    }
    return -1;
}

uint64_t vg_slots_used(const struct vg_slot *slots, const _Atomic uint32_t *high_water)
{
    uint32_t hw = atomic_load(high_water);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < hw; i++)
        sum += atomic_load(&slots[i].used);
    return sum;
}

uint64_t vg_slots_used_live(struct vg_slot *slots, _Atomic uint32_t *high_water)
{
    vg_slots_reap(slots, high_water);
    return vg_slots_used(slots, high_water);
}

/*
 * Optimistic charge: publish the bytes in our own slot first, then check the
 * total. Two processes racing at the limit may both back off (a spurious OOM
 * that the retry below mostly absorbs) but the limit is never passed, and no
 * process ever waits on another.
 */
int vg_slots_charge(struct vg_slot *slots, _Atomic uint32_t *high_water, int idx, uint64_t bytes,
                    uint64_t limit)
{
    struct vg_slot *mine = &slots[idx];
    for (int attempt = 0; attempt < 4; attempt++) {
        atomic_fetch_add(&mine->used, bytes);
        uint64_t total = vg_slots_used(slots, high_water);
        if (total <= limit)
            return 0;
        atomic_fetch_sub(&mine->used, bytes);
        /* Over: maybe a dead process still holds memory. */
        if (attempt == 0 && vg_slots_reap(slots, high_water) > 0)
            continue;
        if (vg_slots_used(slots, high_water) + bytes > limit)
            return -1;
        sched_yield(); /* another charger was in flight; try again */
    }
    return -1;
}

void vg_slots_uncharge(struct vg_slot *slots, int idx, uint64_t bytes)
{
    struct vg_slot *mine = &slots[idx];
    uint64_t cur = atomic_load(&mine->used);
    uint64_t next;
    do {
        next = cur > bytes ? cur - bytes : 0;
    } while (!atomic_compare_exchange_weak(&mine->used, &cur, next));
}
