/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_broker.c - vgpu-broker: grants the compute token of every GPU whose
 * scheduling file is in DIR (vgpu_sched.h, broker.c). vgpud runs one and
 * restarts it if it exits; slices never write anything it trusts.
 *
 *   vgpu-broker --dir DIR [--standalone] [--orphan-s N --owner PIDFILE]
 *
 * One thread per GPU file; a GPU file is served by whoever holds its lock in
 * DIR/.broker.lock (vg_broker_lock: not the GPU file, which tenants can lock), so
 * a second broker (or a standalone process) waits instead of competing.
 * With vgpud a slice's settings come from its .conf files only; --standalone
 * takes them from the slices' own .req files (cooperative processes).
 * New GPU files are picked up within 100 ms. SIGTERM/SIGINT end it.
 *
 * It outlives vgpud: throttled slices wait on its grants, and workloads never depend
 * on vgpud being up (a restart or an upgrade). The vgpud that owns DIR names itself in
 * PIDFILE (a new vgpud adopts a running broker of its own program, or starts its own
 * and stops this one); with --orphan-s N > 0 the broker exits once no vgpud named
 * there has been alive for N seconds (0: never).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/broker.h"

#define MAX_GPUS 64

static volatile int g_stop;
static const char *g_dir;
static int g_confs = 1;
static long g_orphan_s;
static const char *g_owner; /* vgpud's pidfile */

struct served {
    char name[VGPU_SCHED_UUID_LEN];
    ino_t ino; /* a file made again under the same name is another file: served too */
};

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Wait for the file's lock, then serve it until stopped. */
static void *serve(void *arg)
{
    struct served *sv = arg;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", g_dir, sv->name);
    /* Never a blocking open: a file lease (F_SETLEASE, which a container root may take
     * on a file root owns while no one has it open for writing) would hold it for the
     * lease-break time. This fd (writable) keeps anyone from taking one later. */
    int fd, said = 0;
    while ((fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0 && errno == EWOULDBLOCK &&
           !g_stop) {
        if (!said++)
            fprintf(stderr, "vgpu-broker: %s: leased by another process; serving it once the "
                            "kernel breaks the lease\n", path);
        usleep(10000);
    }
    if (fd < 0) {
        if (!g_stop)
            fprintf(stderr, "vgpu-broker: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    int lock;
    while ((lock = vg_broker_lock(fd, path)) < 0 && errno == EAGAIN && !g_stop)
        usleep(10000); /* another broker serves it (an upgrade's hand-over): take over at once */
    if (lock < 0) {
        if (!g_stop)
            fprintf(stderr, "vgpu-broker: %s: cannot take its lock (%s/%s): %s\n", path, g_dir,
                    VGPU_BROKER_LOCK_NAME, strerror(errno));
        close(fd);
        return NULL;
    }
    const char *why = "";
    struct vg_bgpu *g = vg_bgpu_open(path, g_confs, &why);
    if (!g) {
        fprintf(stderr, "vgpu-broker: %s: %s\n", path, why);
        close(lock);
        close(fd);
        return NULL;
    }
    fprintf(stderr, "vgpu-broker: serving %s\n", path);
    vg_bgpu_run(g, &g_stop);
    close(lock);
    close(fd);
    return NULL;
}

/* Is the vgpud named in the owner pidfile alive? (A pid, written by vgpud at its start.) */
static int owner_alive(void)
{
    char buf[32] = {0};
    int fd = open(g_owner, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int is_gpu_file(const char *n)
{
    return n[0] && n[0] != '.' && !strchr(n, '.');
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            g_dir = argv[++i];
        else if (!strcmp(argv[i], "--standalone"))
            g_confs = 0;
        else if (!strcmp(argv[i], "--orphan-s") && i + 1 < argc) {
            char *end;
            g_orphan_s = strtol(argv[++i], &end, 10);
            if (*end || g_orphan_s < 0) {
                fprintf(stderr, "vgpu-broker: --orphan-s: '%s' is not a number of seconds\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--owner") && i + 1 < argc)
            g_owner = argv[++i];
        else {
            fprintf(stderr, "usage: vgpu-broker --dir DIR [--standalone] "
                            "[--orphan-s N --owner PIDFILE]\n");
            return 2;
        }
    }
    if (!g_dir || (g_orphan_s > 0 && !g_owner)) {
        fprintf(stderr, "usage: vgpu-broker --dir DIR [--standalone] "
                        "[--orphan-s N --owner PIDFILE]\n");
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL); /* hand-overs wait on our sleeps */
    static struct served sv[MAX_GPUS];
    pthread_t th[MAX_GPUS];
    int n = 0;
    int said = 0;
    double orphan_since = 0;
    while (!g_stop) {
        if (g_orphan_s > 0) {
            if (owner_alive())
                orphan_since = 0;
            else if (orphan_since == 0)
                orphan_since = now_s();
            else if (now_s() - orphan_since > (double)g_orphan_s) {
                fprintf(stderr, "vgpu-broker: no vgpud for %ld s; exiting\n", g_orphan_s);
                g_stop = 1;
                break;
            }
        }
        /* The directory or a file deleted under us (vgpud makes them again): what we
         * serve goes on (running containers have the old files mounted). */
        DIR *d = opendir(g_dir);
        if (!d) {
            if (!said)
                fprintf(stderr, "vgpu-broker: %s: %s; waiting for it\n", g_dir, strerror(errno));
            said = 1;
            usleep(100000);
            continue;
        }
        said = 0;
        struct dirent *de;
        while ((de = readdir(d)) != NULL && n < MAX_GPUS) {
            struct stat sb;
            if (!is_gpu_file(de->d_name) || strlen(de->d_name) >= VGPU_SCHED_UUID_LEN ||
                fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
                continue;
            int known = 0;
            for (int i = 0; i < n && !known; i++)
                known = !strcmp(sv[i].name, de->d_name) && sv[i].ino == sb.st_ino;
            if (known)
                continue;
            snprintf(sv[n].name, sizeof(sv[n].name), "%s", de->d_name);
            sv[n].ino = sb.st_ino;
            if (pthread_create(&th[n], NULL, serve, &sv[n]) == 0)
                n++;
        }
        closedir(d);
        usleep(100000);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    return 0;
}
