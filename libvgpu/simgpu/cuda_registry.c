/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_registry.c - the process's live handles and device address ranges.
 *
 * Applications hand back whatever pointer they like; looking it up here before
 * touching it turns a stale or bogus handle into CUDA_ERROR_INVALID_HANDLE and
 * an unknown device pointer into CUDA_ERROR_INVALID_VALUE instead of a crash.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ---- handles: an open-addressing set of pointers, guarded by g_hlock ---- */
#define TOMB ((uintptr_t)1)
static pthread_rwlock_t g_hlock = PTHREAD_RWLOCK_INITIALIZER;
static uintptr_t *g_hset;  /* capacity g_hcap (power of two); 0 = empty, TOMB = deleted */
static size_t g_hcap, g_hused; /* g_hused counts live and tombstone entries */

static size_t hslot(uintptr_t p, size_t cap)
{
    uint64_t x = (uint64_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static int hgrow(void)
{
    size_t ncap = g_hcap ? g_hcap * 2 : 256;
    uintptr_t *n = calloc(ncap, sizeof(*n));
    if (!n)
        return -1;
    size_t used = 0;
    for (size_t i = 0; i < g_hcap; i++) {
        uintptr_t p = g_hset[i];
        if (p == 0 || p == TOMB)
            continue;
        size_t j = hslot(p, ncap);
        while (n[j])
            j = (j + 1) & (ncap - 1);
        n[j] = p;
        used++;
    }
    free(g_hset);
    g_hset = n;
    g_hcap = ncap;
    g_hused = used;
    return 0;
}

int sg_handle_add(const void *h)
{
    uintptr_t p = (uintptr_t)h;
    int rc = 0;
    pthread_rwlock_wrlock(&g_hlock);
    if ((g_hused + 1) * 2 > g_hcap && hgrow() != 0) {
        rc = -1;
        goto out;
    }
    size_t j = hslot(p, g_hcap);
    while (g_hset[j] != 0 && g_hset[j] != TOMB)
        j = (j + 1) & (g_hcap - 1);
    if (g_hset[j] == 0)
        g_hused++;
    g_hset[j] = p;
out:
    pthread_rwlock_unlock(&g_hlock);
    return rc;
}

/* Index of p in the set, or -1. Caller holds g_hlock. */
static long hfind(uintptr_t p)
{
    if (!g_hcap || p == 0 || p == TOMB)
        return -1;
    for (size_t j = hslot(p, g_hcap), n = 0; n < g_hcap; j = (j + 1) & (g_hcap - 1), n++) {
        if (g_hset[j] == p)
            return (long)j;
        if (g_hset[j] == 0)
            return -1;
    }
    return -1;
}

void sg_handle_del(const void *h)
{
    pthread_rwlock_wrlock(&g_hlock);
    long j = hfind((uintptr_t)h);
    if (j >= 0)
        g_hset[j] = TOMB;
    pthread_rwlock_unlock(&g_hlock);
}

int sg_handle_ok(const void *h, uint32_t magic)
{
    pthread_rwlock_rdlock(&g_hlock);
    int ok = hfind((uintptr_t)h) >= 0 && *(const uint32_t *)h == magic;
    pthread_rwlock_unlock(&g_hlock);
    return ok;
}

int sg_handle_take(const void *h, uint32_t magic)
{
    pthread_rwlock_wrlock(&g_hlock);
    long j = hfind((uintptr_t)h);
    int ok = j >= 0 && *(const uint32_t *)h == magic;
    if (ok)
        g_hset[j] = TOMB;
    pthread_rwlock_unlock(&g_hlock);
    return ok;
}

/* ---- ranges: sorted by base, non-overlapping, guarded by g_rlock ---- */
static pthread_rwlock_t g_rlock = PTHREAD_RWLOCK_INITIALIZER;
static struct sg_range *g_ranges;
static size_t g_nranges, g_rcap;

/* Index of the first range whose base is > addr. Caller holds g_rlock. */
static size_t rupper(uintptr_t addr)
{
    size_t lo = 0, hi = g_nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_ranges[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int sg_range_add(const struct sg_range *r)
{
    int rc = 0;
    pthread_rwlock_wrlock(&g_rlock);
    if (g_nranges == g_rcap) {
        size_t ncap = g_rcap ? g_rcap * 2 : 64;
        struct sg_range *n = realloc(g_ranges, ncap * sizeof(*n));
        if (!n) {
            rc = -1;
            goto out;
        }
        g_ranges = n;
        g_rcap = ncap;
    }
    size_t i = rupper(r->base);
    memmove(&g_ranges[i + 1], &g_ranges[i], (g_nranges - i) * sizeof(*g_ranges));
    g_ranges[i] = *r;
    g_nranges++;
out:
    pthread_rwlock_unlock(&g_rlock);
    return rc;
}

static void rremove(size_t i, struct sg_range *out)
{
    if (out)
        *out = g_ranges[i];
    memmove(&g_ranges[i], &g_ranges[i + 1], (g_nranges - i - 1) * sizeof(*g_ranges));
    g_nranges--;
}

int sg_range_take(uintptr_t base, int kinds, struct sg_range *out)
{
    int rc = -1;
    pthread_rwlock_wrlock(&g_rlock);
    size_t i = rupper(base);
    if (i > 0 && g_ranges[i - 1].base == base && (g_ranges[i - 1].kind & kinds)) {
        rremove(i - 1, out);
        rc = 0;
    }
    pthread_rwlock_unlock(&g_rlock);
    return rc;
}

int sg_range_take_ctx(const struct sg_ctx *ctx, struct sg_range *out)
{
    int rc = -1;
    pthread_rwlock_wrlock(&g_rlock);
    for (size_t i = 0; i < g_nranges; i++) {
        if (g_ranges[i].ctx == ctx) {
            rremove(i, out);
            rc = 0;
            break;
        }
    }
    pthread_rwlock_unlock(&g_rlock);
    return rc;
}

int sg_range_find(uintptr_t addr, size_t len, struct sg_range *out)
{
    int rc = -1;
    pthread_rwlock_rdlock(&g_rlock);
    size_t i = rupper(addr);
    if (i > 0) {
        const struct sg_range *r = &g_ranges[i - 1];
        size_t span = r->kind == SG_KIND_RESERVE ? r->maplen : r->size;
        if (addr - r->base <= span && len <= span - (addr - r->base)) {
            if (out)
                *out = *r;
            rc = 0;
        }
    }
    pthread_rwlock_unlock(&g_rlock);
    return rc;
}
