/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_record.c - write down the broker's policy inputs (broker_record.h).
 *
 * Off unless VGPU_BROKER_RECORD is set: a NULL record costs each step one test. The
 * file is written with stdio and flushed at each step that wrote something, so a record
 * of a broker killed mid-run ends at a whole step.
 */
#include "broker_record.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct vg_record {
    FILE *f;
    struct vg_pol_settings set[VG_POL_SLICES]; /* what the policy held after the last step */
    struct vg_pol_claims req[VG_POL_SLICES];
    int known[VG_POL_SLICES];
};

struct vg_record *vg_record_open(const char *uuid, uint32_t epoch)
{
    const char *dir = getenv(VG_RECORD_ENV);
    if (!dir || !*dir)
        return NULL;
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s.rec", dir, uuid) >= (int)sizeof(path)) {
        fprintf(stderr, "vgpu: %s=%s: the path is too long; not recording\n", VG_RECORD_ENV, dir);
        return NULL;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "a");
    struct vg_record *r = f ? calloc(1, sizeof(*r)) : NULL;
    if (!r) {
        fprintf(stderr, "vgpu: %s: cannot record the broker's inputs in %s: %s\n", VG_RECORD_ENV, path,
                strerror(errno ? errno : ENOMEM));
        if (f)
            fclose(f);
        else if (fd >= 0)
            close(fd);
        return NULL;
    }
    r->f = f;
    fprintf(f, "broker %u\n", epoch);
    return r;
}

void vg_record_take_on(struct vg_record *r, uint64_t now, int i)
{
    if (!r)
        return;
    fprintf(r->f, "take %llu %d\n", (unsigned long long)now, i);
    r->known[i] = 0; /* its settings and claims are written at the next step */
}

void vg_record_drop(struct vg_record *r, uint64_t now, int i)
{
    if (!r)
        return;
    fprintf(r->f, "drop %llu %d\n", (unsigned long long)now, i);
    r->known[i] = 0;
}

static void write_req(FILE *f, int i, const struct vg_pol_claims *c)
{
    fprintf(f, "req %d %u %llu %u %u %llu %u %llu %u %llu %llu %llu %u %llu %u %llu %u %llu\n", i, c->want,
            (unsigned long long)c->want_ns, c->owner_seq, c->release_seq, (unsigned long long)c->release_ns,
            c->drain_seq, (unsigned long long)c->drain_ns, c->yield_seq, (unsigned long long)c->idle_ns,
            (unsigned long long)c->active_ns, (unsigned long long)c->idle_since, c->start_seq,
            (unsigned long long)c->start_ns, c->launch_seq, (unsigned long long)c->launch_ns, c->turn_seq,
            (unsigned long long)c->turn_ns);
}

void vg_record_step(struct vg_record *r, const struct vg_pol *p, uint64_t now)
{
    if (!r)
        return;
    for (int i = 0; i < (int)VG_POL_SLICES; i++) {
        const struct vg_pol_slice *s = &p->sl[i];
        if (!s->in_use)
            continue;
        if (!r->known[i] || memcmp(&s->set, &r->set[i], sizeof(s->set)))
            fprintf(r->f, "set %d %u %u %u %u\n", i, s->set.share, s->set.prio, s->set.policy, s->set.floor);
        if (!r->known[i] || memcmp(&s->req, &r->req[i], sizeof(s->req)))
            write_req(r->f, i, &s->req);
    }
    fprintf(r->f, "step %llu\n", (unsigned long long)now);
    fflush(r->f);
}

void vg_record_stepped(struct vg_record *r, const struct vg_pol *p)
{
    if (!r)
        return;
    for (int i = 0; i < (int)VG_POL_SLICES; i++) {
        r->set[i] = p->sl[i].set;
        r->req[i] = p->sl[i].req;
        r->known[i] = p->sl[i].in_use;
    }
}
