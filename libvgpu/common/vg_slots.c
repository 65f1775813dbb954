/* SPDX-License-Identifier: Apache-2.0 */
/* vg_slots.c - lock-free per-process accounting; see vg_slots.h. */
#include "vg_slots.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Start time (field 22 of /proc/<pid>/stat) and state (field 3); 0 when unknown. */
static uint64_t proc_stat(pid_t pid, char *state)
{
    char path[64], buf[1024];
    *state = '?';
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
    if (!p || p[1] != ' ')
        return 0;
    *state = p[2];
    /* After ") " comes field 3 (state); starttime is field 22. */
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return strtoull(p, NULL, 10);
}

uint64_t vg_proc_start_time(pid_t pid)
{
    char state;
    return proc_stat(pid, &state);
}

/* A zombie (or a task being torn down) holds no memory: it counts as gone. */
static int running_since(pid_t pid, uint64_t start_time)
{
    char state;
    uint64_t now = proc_stat(pid, &state);
    if (state == 'Z' || state == 'X' || state == 'x')
        return 0;
    /* /proc may be unreadable (hidepid); then trust that the pid exists. */
    return start_time == 0 || now == 0 || now == start_time;
}

/* Inode of the initial pid namespace (PROC_PID_INIT_INO in the kernel): its /proc
 * shows every process of every namespace. */
#define VG_PID_NS_INIT 0xEFFFFFFCull

uint64_t vg_pid_ns_self(void)
{
    /* Cached: a process never changes pid namespace (setns/unshare only affect children). */
    static _Atomic uint64_t cached;
    uint64_t ns = atomic_load(&cached);
    if (ns == 0) {
        struct stat sb;
        ns = stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
        atomic_store(&cached, ns);
    }
    return ns;
}

/* The pid, in our namespace, of the process of namespace ns that started at
 * start_time: >0 found, 0 gone, -1 cannot tell (no process of ns in our /proc). */
static long foreign_lookup(uint64_t ns, uint64_t start_time)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    long found = 0;
    int seen_ns = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[300]; /* d_name is up to 255 bytes */
        struct stat sb;
        snprintf(path, sizeof(path), "/proc/%s/ns/pid", e->d_name);
        if (stat(path, &sb) != 0 || (uint64_t)sb.st_ino != ns)
            continue;
        seen_ns = 1;
        long pid = atol(e->d_name);
        if (running_since((pid_t)pid, start_time)) {
            found = pid;
            break;
        }
    }
    closedir(d);
    /* Nobody of that namespace in our /proc: either it is gone, or our /proc
     * cannot show it (sibling containers). Only the host view is conclusive. */
    if (found)
        return found;
    return seen_ns || vg_pid_ns_self() == VG_PID_NS_INIT ? 0 : -1;
}

uint32_t vg_pid_visible(uint32_t pid, uint64_t start_time, uint64_t pid_ns)
{
    uint64_t mine = vg_pid_ns_self();
    if (pid_ns == 0 || mine == 0 || pid_ns == mine)
        return vg_pid_alive(pid, start_time, pid_ns) ? pid : 0;
    long found = foreign_lookup(pid_ns, start_time);
    return found > 0 ? (uint32_t)found : 0;
}

int vg_pid_alive(uint32_t pid, uint64_t start_time, uint64_t pid_ns)
{
    if (pid == 0 || (pid & VG_SLOT_REAPING))
        return 0;
    uint64_t mine = vg_pid_ns_self();
    if (pid_ns != 0 && mine != 0 && pid_ns != mine)
        return foreign_lookup(pid_ns, start_time) != 0; /* -1 (cannot tell) counts as alive */
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return 0;
    return running_since((pid_t)pid, start_time);
}

static void slot_clear(struct vg_slot *s, uint32_t marker)
{
    atomic_store(&s->used, 0);
    atomic_store(&s->busy_ns, 0);
    atomic_store(&s->last_active_ns, 0);
    atomic_store(&s->start_time, 0);
    atomic_store(&s->pid_ns, 0);
    uint32_t expect = marker;
    atomic_compare_exchange_strong(&s->pid, &expect, 0);
}

static void slot_take(struct vg_slot *s, uint32_t me, uint64_t start)
{
    atomic_store(&s->used, 0);
    atomic_store(&s->busy_ns, 0);
    atomic_store(&s->last_active_ns, 0);
    atomic_store(&s->start_time, start);
    atomic_store(&s->pid_ns, vg_pid_ns_self());
    (void)me;
}

/* The high water as far as it can be believed: a table another process may write
 * (a slice's usage file) must not send us past its end. */
static uint32_t high_water_of(const _Atomic uint32_t *high_water)
{
    uint32_t hw = atomic_load(high_water);
    return hw > VG_SLOTS_MAX ? VG_SLOTS_MAX : hw;
}

unsigned vg_slots_reap(struct vg_slot *slots, _Atomic uint32_t *high_water)
{
    uint32_t hw = high_water_of(high_water);
    uint32_t marker = VG_SLOT_REAPING | (uint32_t)getpid();
    unsigned freed = 0;
    for (uint32_t i = 0; i < hw; i++) {
        struct vg_slot *s = &slots[i];
        uint32_t pid = atomic_load(&s->pid);
        if (pid == 0)
            continue;
        if (pid & VG_SLOT_REAPING) {
            /* A reaper that died half-way: finish its job. */
            if (vg_pid_alive(pid & ~VG_SLOT_REAPING, 0, atomic_load(&s->pid_ns)))
                continue;
        } else if (vg_pid_alive(pid, atomic_load(&s->start_time), atomic_load(&s->pid_ns))) {
            continue;
        }
        if (atomic_compare_exchange_strong(&s->pid, &pid, marker)) {
            /* The marker's pid is ours now: judge it in our namespace if we die here. */
            atomic_store(&s->pid_ns, vg_pid_ns_self());
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
    uint64_t ns = vg_pid_ns_self();
    if (capacity > VG_SLOTS_MAX)
        capacity = VG_SLOTS_MAX;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t hw = high_water_of(high_water);
        /* Our own slot from before an exec: the old image's memory died with it.
         * Same pid, namespace and start time: pid 1 of two containers differ. */
        for (uint32_t i = 0; i < hw; i++) {
            if (atomic_load(&slots[i].pid) == me && atomic_load(&slots[i].pid_ns) == ns &&
                atomic_load(&slots[i].start_time) == start) {
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
    uint32_t hw = high_water_of(high_water);
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

static uint64_t used_by_others(const struct vg_slot *slots, const _Atomic uint32_t *high_water, int idx)
{
    uint32_t hw = high_water_of(high_water);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < hw; i++)
        if ((int)i != idx)
            sum += atomic_load(&slots[i].used);
    return sum;
}

/*
 * Optimistic charge: publish the bytes in our own slot first, then check the
 * total. Two processes racing at the limit may both back off (a spurious OOM
 * that the retry below mostly absorbs) but the limit is never passed, and no
 * process ever waits on another.
 *
 * Our own part of the total is *own, never our slot read back: with a private
 * tally (a table others may write), a process that zeroes our slot between our
 * write and our sum must not make our memory vanish from the total
 * (tests/e2e/test_hostile_limits.py). own NULL: the slot is its own tally.
 */
int vg_slots_charge_own(struct vg_slot *slots, _Atomic uint32_t *high_water, int idx, uint64_t bytes,
                        uint64_t limit, _Atomic uint64_t *own)
{
    struct vg_slot *mine = &slots[idx];
    _Atomic uint64_t *tally = own ? own : &mine->used;
    for (int attempt = 0; attempt < 4; attempt++) {
        uint64_t total = atomic_fetch_add(tally, bytes) + bytes;
        if (own)
            atomic_store(&mine->used, total); /* published for the others */
        if (used_by_others(slots, high_water, idx) + total <= limit)
            return 0;
        uint64_t back = atomic_fetch_sub(tally, bytes) - bytes;
        if (own)
            atomic_store(&mine->used, back);
        /* Over: maybe a dead process still holds memory. */
        if (attempt == 0 && vg_slots_reap(slots, high_water) > 0)
            continue;
        if (used_by_others(slots, high_water, idx) + back + bytes > limit)
            return -1;
        sched_yield(); /* another charger was in flight; try again */
    }
    return -1;
}

int vg_slots_charge(struct vg_slot *slots, _Atomic uint32_t *high_water, int idx, uint64_t bytes,
                    uint64_t limit)
{
    return vg_slots_charge_own(slots, high_water, idx, bytes, limit, NULL);
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
