/* SPDX-License-Identifier: Apache-2.0 */
/*
 * leaser.c - a hostile tenant that takes file leases (tests/e2e/test_hostile_io.py).
 *
 *   leaser SECONDS STATE FILE...
 *
 * Run inside a vGPU container as its root. Opens every FILE read-only (what a read-only
 * mount allows) and takes a file lease on it (fcntl F_SETLEASE): a write lease where the
 * kernel grants one (no other opener anywhere: it makes every open of the file wait), else
 * a read lease (no writer anywhere: it makes every open for write wait). It never lets go:
 * a lease the kernel ends after a break (lease-break-time) is taken again at once, every
 * 5 ms, as is one it could not take yet. Stops after SECONDS, or when STATE.stop exists.
 *
 * After each round that changed something it rewrites STATE (through a temporary file and
 * a rename) with one JSON object: {"files": [{"path", "lease": "write"|"read"|"none",
 * "errno": the last refusal}], "taken": leases taken so far}.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_FILES 64

struct leased {
    const char *path;
    int fd;
    int lease; /* F_WRLCK, F_RDLCK or F_UNLCK */
    int err;
};

static const char *lease_name(int lease)
{
    return lease == F_WRLCK ? "write" : lease == F_RDLCK ? "read" : "none";
}

/* Take a write lease, else a read one; what is held now. */
static int take(struct leased *f)
{
    if (fcntl(f->fd, F_SETLEASE, F_WRLCK) == 0)
        return F_WRLCK;
    f->err = errno;
    if (fcntl(f->fd, F_SETLEASE, F_RDLCK) == 0)
        return F_RDLCK;
    f->err = errno;
    return F_UNLCK;
}

static void write_state(const char *state, const struct leased *files, int n, long taken)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", state);
    FILE *out = fopen(tmp, "w");
    if (!out)
        return;
    fprintf(out, "{\"files\": [");
    for (int i = 0; i < n; i++)
        fprintf(out, "%s{\"path\": \"%s\", \"lease\": \"%s\", \"errno\": \"%s\"}", i ? ", " : "",
                files[i].path, lease_name(files[i].lease),
                files[i].err ? strerrorname_np(files[i].err) : "");
    fprintf(out, "], \"taken\": %ld}\n", taken);
    fclose(out);
    rename(tmp, state);
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc - 3 > MAX_FILES) {
        fprintf(stderr, "usage: leaser SECONDS STATE FILE...\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    const char *state = argv[2];
    char stop[4096];
    snprintf(stop, sizeof(stop), "%s.stop", state);
    /* A break is announced by SIGIO: ignored, the lease is kept until the kernel ends it. */
    signal(SIGIO, SIG_IGN);
    struct leased files[MAX_FILES];
    int n = argc - 3;
    for (int i = 0; i < n; i++) {
        files[i] = (struct leased){.path = argv[i + 3], .lease = F_UNLCK};
        files[i].fd = open(files[i].path, O_RDONLY | O_CLOEXEC);
        if (files[i].fd < 0) {
            fprintf(stderr, "leaser: %s: %s\n", files[i].path, strerror(errno));
            return 1;
        }
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long taken = 0;
    int changed = 1;
    for (;;) {
        for (int i = 0; i < n; i++) {
            /* F_GETLEASE: F_UNLCK once the kernel ended a broken lease. */
            int held = fcntl(files[i].fd, F_GETLEASE);
            if (held == F_UNLCK) {
                held = take(&files[i]);
                if (held != F_UNLCK)
                    taken++;
            }
            if (held != files[i].lease) {
                files[i].lease = held;
                changed = 1;
            }
        }
        if (changed)
            write_state(state, files, n, taken);
        changed = 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9;
        if (elapsed > seconds || access(stop, F_OK) == 0)
            break;
        usleep(5000);
    }
    write_state(state, files, n, taken);
    return 0;
}
