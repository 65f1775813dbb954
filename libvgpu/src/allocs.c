/* SPDX-License-Identifier: Apache-2.0 */
/*
 * allocs.c - what this process allocated, so a free uncharges exactly what the
 * allocation charged. Process-local: a dead process's allocations die with it
 * and its slot in the region is reaped instead.
 *
 * One open-addressing table per kind (pointers, VMM handles, arrays, contexts
 * live in different key spaces), linear probing with tombstones.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_internal.h"

#define EMPTY 0ull
#define TOMBSTONE 1ull /* never a valid pointer or handle */

struct entry {
    uint64_t key;
    uint64_t bytes;
    int dev;
};

struct table {
    pthread_mutex_t lock;
    struct entry *slots;
    size_t cap;  /* power of two */
    size_t used; /* live + tombstones */
};

static struct table g_tables[VG_ALLOC_KINDS] = {
    [0 ... VG_ALLOC_KINDS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER},
};

static size_t hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

/* Rehash without tombstones; double only when live entries need the room, so
 * a long alloc/free churn does not grow the table forever. */
static int grow(struct table *t)
{
    size_t live = 0;
    for (size_t i = 0; i < t->cap; i++)
        live += t->slots[i].key != EMPTY && t->slots[i].key != TOMBSTONE;
    size_t ncap = t->cap == 0 ? 1024 : (live + 1) * 4 > t->cap ? t->cap * 2 : t->cap;
    struct entry *n = calloc(ncap, sizeof(*n));
    if (!n)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        struct entry *e = &t->slots[i];
        if (e->key == EMPTY || e->key == TOMBSTONE)
            continue;
        size_t j = hash(e->key) & (ncap - 1);
        while (n[j].key != EMPTY)
            j = (j + 1) & (ncap - 1);
        n[j] = *e;
    }
    free(t->slots);
    t->slots = n;
    t->cap = ncap;
    t->used = live;
    return 0;
}

int vg_allocs_put(enum vg_alloc_kind kind, uint64_t key, int dev, uint64_t bytes)
{
    struct table *t = &g_tables[kind];
    if (key == EMPTY || key == TOMBSTONE)
        return -1;
    pthread_mutex_lock(&t->lock);
    int rc = 0;
    if ((t->used + 1) * 2 > t->cap && grow(t) != 0) {
        rc = -1;
        goto out;
    }
    size_t i = hash(key) & (t->cap - 1), tomb = (size_t)-1;
    for (;; i = (i + 1) & (t->cap - 1)) {
        uint64_t k = t->slots[i].key;
        if (k == key)
            break; /* the driver reused an address we missed a free for: overwrite */
        if (k == TOMBSTONE && tomb == (size_t)-1)
            tomb = i;
        if (k == EMPTY) {
            if (tomb != (size_t)-1)
                i = tomb;
            else
                t->used++;
            break;
        }
    }
    t->slots[i] = (struct entry){.key = key, .bytes = bytes, .dev = dev};
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int vg_allocs_take(enum vg_alloc_kind kind, uint64_t key, int *dev, uint64_t *bytes)
{
    struct table *t = &g_tables[kind];
    int rc = -1;
    pthread_mutex_lock(&t->lock);
    if (t->cap == 0 || key == EMPTY || key == TOMBSTONE)
        goto out;
    for (size_t i = hash(key) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        struct entry *e = &t->slots[i];
        if (e->key == EMPTY)
            break;
        if (e->key == key) {
            *dev = e->dev;
            *bytes = e->bytes;
            e->key = TOMBSTONE;
            rc = 0;
            break;
        }
    }
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}
