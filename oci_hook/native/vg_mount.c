/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_mount.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/mount.h>

#include "vg_common.h"

#define PRELOAD_TARGET "etc/ld.so.preload"
#define PRELOAD_MAX (64 << 10)  /* bytes read of the image's own ld.so.preload */
#define MAX_LINK_HOPS 40        /* like the kernel's MAXSYMLINKS */

#ifndef SYS_openat2
#define SYS_openat2 437         /* the same on every architecture */
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428       /* the same on every architecture */
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif

/* The rootfs directory fd and the path of the last failure (for the message). */
struct root {
    int fd;
    char failed[VG_PATH_MAX];
};

static int root_open(struct root *r, const char *rel, int flags)
{
    struct open_how how = {.flags = (unsigned long long)(flags | O_CLOEXEC),
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, r->fd, rel, &how, sizeof(how));
    if (fd < 0) {
        snprintf(r->failed, sizeof(r->failed), "/%s", rel);
        return -1;
    }
    return (int)fd;
}

/* parent/name of `rel` (trailing slashes dropped), in caller buffers. */
static void split(const char *rel, char *parent, char *name)
{
    char tmp[VG_PATH_MAX];
    vg_strlcpy(tmp, rel, sizeof(tmp));
    size_t len = strlen(tmp);
    while (len > 1 && tmp[len - 1] == '/')
        tmp[--len] = '\0';
    char *slash = strrchr(tmp, '/');
    if (slash == NULL) {
        parent[0] = '\0';
        vg_strlcpy(name, tmp, VG_PATH_MAX);
        return;
    }
    vg_strlcpy(name, slash + 1, VG_PATH_MAX);
    *slash = '\0';
    vg_strlcpy(parent, tmp, VG_PATH_MAX);
}

/* Where the dangling symlink parent/name points, relative to the root, into `out`. */
static int follow(struct root *r, const char *parent, int pfd, const char *name, int hops,
                  char *out)
{
    struct stat st;
    snprintf(r->failed, sizeof(r->failed), "/%s%s%s", parent, *parent ? "/" : "", name);
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return -1;
    if (!S_ISLNK(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    if (hops >= MAX_LINK_HOPS) {
        errno = ELOOP;
        return -1;
    }
    char link[VG_PATH_MAX];
    ssize_t len = readlinkat(pfd, name, link, sizeof(link) - 1);
    if (len < 0)
        return -1;
    link[len] = '\0';
    /* Relative to the link's directory; ".." is resolved by openat2 on the real
     * directory, and IN_ROOT keeps both ".." and absolute links inside the root. */
    if (link[0] == '/') {
        const char *p = link;
        while (*p == '/')
            p++;
        vg_strlcpy(out, p, VG_PATH_MAX);
    } else if (*parent) {
        if (snprintf(out, VG_PATH_MAX, "%s/%s", parent, link) >= VG_PATH_MAX) {
            errno = ENAMETOOLONG;
            return -1;
        }
    } else {
        vg_strlcpy(out, link, VG_PATH_MAX);
    }
    return 0;
}

/* Making parent/name failed with errno: where the name is there after all (a
 * race, or a link whose target is missing), the path to go on with is in
 * target (0); else -1 with errno set and r->failed naming what failed. */
static int already_there(struct root *r, const char *rel, const char *parent, int pfd, const char *name, int hops,
                         char *target)
{
    if (errno != EEXIST) {
        int e = errno;
        snprintf(r->failed, sizeof(r->failed), "/%s", rel);
        errno = e;
        return -1;
    }
    return follow(r, parent, pfd, name, hops, target);
}

static void close_keeping_errno(int fd)
{
    int e = errno;
    close(fd);
    errno = e;
}

/* O_PATH fd of directory `rel`, made (with its parents) where missing. */
static int ensure_dir(struct root *r, const char *rel, int hops)
{
    if (rel[0] == '\0' || strcmp(rel, ".") == 0)
        return fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
    int fd = root_open(r, rel, O_PATH | O_DIRECTORY);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    char parent[VG_PATH_MAX], name[VG_PATH_MAX], target[VG_PATH_MAX];
    split(rel, parent, name);
    if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        snprintf(r->failed, sizeof(r->failed), "/%s", rel);
        errno = ENOENT;
        return -1;
    }
    int pfd = ensure_dir(r, parent, hops);
    if (pfd < 0)
        return -1;
    if (mkdirat(pfd, name, 0755) != 0) {
        int rc = already_there(r, rel, parent, pfd, name, hops, target);
        close_keeping_errno(pfd);
        return rc != 0 ? -1 : ensure_dir(r, target, hops + 1);
    }
    close(pfd);
    return root_open(r, rel, O_PATH | O_DIRECTORY);
}

/* O_PATH fd of the non-directory `rel`, made as an empty file where missing. */
static int ensure_file(struct root *r, const char *rel, int hops)
{
    int fd = root_open(r, rel, O_PATH);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    char parent[VG_PATH_MAX], name[VG_PATH_MAX], target[VG_PATH_MAX];
    split(rel, parent, name);
    int pfd = ensure_dir(r, parent, 0);
    if (pfd < 0)
        return -1;
    int made = openat(pfd, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (made < 0) {
        int rc = already_there(r, rel, parent, pfd, name, hops, target);
        close_keeping_errno(pfd);
        return rc != 0 ? -1 : ensure_file(r, target, hops + 1);
    }
    close(made);
    close(pfd);
    return root_open(r, rel, O_PATH);
}

/* A readable fd of the regular file `rel`, or -1. Whatever the image put there is only
 * looked at (O_PATH) before it is opened: opening a device, a FIFO or a socket as host
 * root may do something (a FIFO's writer is let go, a device's driver runs its open). The
 * file is opened again through the O_PATH fd's /proc link, the same inode, else by name
 * once more and kept only if it is still that inode. */
static int open_regular(struct root *r, const char *rel)
{
    int pfd = root_open(r, rel, O_PATH);
    if (pfd < 0)
        return -1;
    struct stat st, again;
    if (fstat(pfd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(pfd);
        return -1;
    }
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", pfd);
    int fd = open(link, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
        fd = root_open(r, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY); /* (no /proc here) */
    close(pfd);
    if (fd >= 0 && (fstat(fd, &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The image's own ld.so.preload (regular files only), up to PRELOAD_MAX bytes. */
static char *read_small(struct root *r, const char *rel, size_t *len)
{
    *len = 0;
    char *buf = calloc(1, PRELOAD_MAX + 1);
    if (buf == NULL)
        return NULL;
    int fd = open_regular(r, rel);
    if (fd < 0)
        return buf;               /* missing, unreachable or not a regular file: nothing to keep */
    ssize_t got;
    while (*len < PRELOAD_MAX && (got = read(fd, buf + *len, PRELOAD_MAX - *len)) > 0)
        *len += (size_t)got;
    close(fd);
    buf[*len] = '\0';
    return buf;
}

/* ld.so.preload: our library first (it must interpose CUDA before anything else),
 * then the image's own entries, ours dropped where the image already listed it. */
static int write_preload(struct root *r, const char *host, const char *line, char *err,
                         size_t errsz)
{
    size_t own_len;
    char *own = read_small(r, PRELOAD_TARGET, &own_len);
    if (own == NULL) {
        snprintf(err, errsz, "failed to read the image's /etc/ld.so.preload: out of memory");
        return -1;
    }
    int fd = open(host, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errsz, "failed to write %s: %s", host, strerror(errno));
        free(own);
        return -1;
    }
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        free(own);
        snprintf(err, errsz, "failed to write %s: %s", host, strerror(errno));
        return -1;
    }
    fprintf(f, "%s\n", line);
    char *save = NULL;
    for (char *l = strtok_r(own, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(l);
        if (n && l[n - 1] == '\r')
            l[--n] = '\0';
        const char *s = l;
        size_t sl = n;
        while (sl && isspace((unsigned char)*s)) {
            s++;
            sl--;
        }
        while (sl && isspace((unsigned char)s[sl - 1]))
            sl--;
        if (sl == 0 || (sl == strlen(line) && strncmp(s, line, sl) == 0))
            continue;
        fprintf(f, "%s\n", l);
    }
    free(own);
    if (fclose(f) != 0) {
        snprintf(err, errsz, "failed to write %s: %s", host, strerror(errno));
        return -1;
    }
    return 0;
}

static unsigned long remount_flags(const struct vg_mount *m)
{
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID;
    if (m->read_only)
        flags |= MS_RDONLY;
    if (!m->device)
        flags |= MS_NODEV;
    if (!m->executable && !m->device)
        flags |= MS_NOEXEC;
    return flags;
}

static void fd_path(char *buf, size_t n, int fd)
{
    snprintf(buf, n, "/proc/self/fd/%d", fd);
}

/* Bind m->source onto m->target inside the root: the fd of the new mount, -2 when
 * nothing was needed, -1 on failure (err set). */
static int bind_one(struct root *r, const struct vg_mount *m, char *err, size_t errsz)
{
    const char *rel = m->target;
    while (*rel == '/')
        rel++;
    /* The detached copy taken in the host's namespace, else the path as seen here. */
    int src = m->src_fd >= 0 ? dup(m->src_fd) : open(m->source, O_PATH | O_CLOEXEC);
    if (src < 0) {
        snprintf(err, errsz, "failed to open %s: %s", m->source, strerror(errno));
        return -1;
    }
    int result = -1, tgt = -1, fresh = -1;
    char sp[64], tp[64];
    struct stat ss, ts;
    if (fstat(src, &ss) != 0) {
        snprintf(err, errsz, "failed to open %s: %s", m->source, strerror(errno));
        goto out;
    }
    if (S_ISDIR(ss.st_mode)) {
        snprintf(err, errsz, "failed to mount %s: is a directory (expected a file or device)",
                 m->source);
        goto out;
    }
    tgt = ensure_file(r, rel, 0);
    if (tgt < 0) {
        snprintf(err, errsz, "failed to make %s in the container: %s: %s", m->target,
                 strerror(errno), r->failed);
        goto out;
    }
    if (fstat(tgt, &ts) != 0) {
        snprintf(err, errsz, "failed to make %s in the container: %s", m->target,
                 strerror(errno));
        goto out;
    }
    if (ts.st_dev == ss.st_dev && ts.st_ino == ss.st_ino) {
        result = -2;              /* mounted already (the hook ran in another phase too) */
        goto out;
    }
    if (m->device && S_ISCHR(ts.st_mode) && ts.st_rdev == ss.st_rdev) {
        result = -2;              /* the runtime made this node from linux.devices */
        goto out;
    }
    if (S_ISDIR(ts.st_mode)) {
        snprintf(err, errsz, "failed to mount onto %s in the container: it is a directory "
                 "in the image", m->target);
        goto out;
    }
    fd_path(sp, sizeof(sp), src);
    fd_path(tp, sizeof(tp), tgt);
    if (m->src_fd >= 0 ? syscall(SYS_move_mount, src, "", tgt, "",
                                 MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0
                       : mount(sp, tp, NULL, MS_BIND, NULL) != 0) {
        snprintf(err, errsz, "failed to bind-mount %s onto %s: %s", m->source, m->target,
                 strerror(errno));
        goto out;
    }
    /* Re-resolve: the fd opened before the bind names the covered file, and a remount
     * through it would remount the rootfs itself. */
    fresh = root_open(r, rel, O_PATH);
    struct stat ns;
    if (fresh < 0 || fstat(fresh, &ns) != 0 || ns.st_dev != ss.st_dev ||
        ns.st_ino != ss.st_ino) {
        int e = errno;
        if (fresh >= 0) {
            fd_path(tp, sizeof(tp), fresh);
            umount2(tp, MNT_DETACH);
        }
        snprintf(err, errsz, "failed to bind-mount %s onto %s: %s", m->source, m->target,
                 fresh < 0 ? strerror(e) : "the target moved during the mount");
        goto out;
    }
    fd_path(tp, sizeof(tp), fresh);
    if (mount(NULL, tp, NULL, remount_flags(m), NULL) != 0) {
        int e = errno;
        umount2(tp, MNT_DETACH);
        snprintf(err, errsz, "failed to remount %s read-only: %s", m->target, strerror(e));
        goto out;
    }
    result = fresh;
    fresh = -1;
out:
    if (fresh >= 0)
        close(fresh);
    if (tgt >= 0)
        close(tgt);
    close(src);
    return result;
}

int vg_plan_apply(const struct vg_plan *plan, char *err, size_t errsz)
{
    struct root r = {.fd = -1};
    r.fd = open(plan->rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (r.fd < 0) {
        /* After pivot_root the host path is gone: the hook ran in a later phase. */
        snprintf(err, errsz, "failed to open the container's rootfs %s: %s (run vgpu-hook "
                 "as a prestart or createRuntime hook)", plan->rootfs, strerror(errno));
        return -1;
    }
    int *done = calloc(plan->n_mounts + 1, sizeof(*done));
    size_t n_done = 0;
    int rc = -1;
    if (done == NULL) {
        snprintf(err, errsz, "out of memory");
        goto out;
    }
    if (plan->preload_host[0] &&
        write_preload(&r, plan->preload_host, plan->preload_line, err, errsz) != 0)
        goto out;
    for (size_t i = 0; i < plan->n_mounts; i++) {
        int fd = bind_one(&r, &plan->mounts[i], err, errsz);
        if (fd == -1)
            goto out;
        if (fd >= 0)
            done[n_done++] = fd;
    }
    rc = 0;
out:
    for (size_t i = n_done; i-- > 0;) {
        if (rc != 0) {
            char p[64];
            fd_path(p, sizeof(p), done[i]);
            umount2(p, MNT_DETACH);
        }
        close(done[i]);
    }
    free(done);
    close(r.fd);
    return rc;
}

int vg_enter_mount_ns(pid_t pid, char *err, size_t errsz)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errsz, "failed to open %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = setns(fd, CLONE_NEWNS);
    int e = errno;
    close(fd);
    if (rc != 0) {
        snprintf(err, errsz, "failed to enter the container's mount namespace: %s",
                 strerror(e));
        return -1;
    }
    return 0;
}

int vg_plan_parse(const struct vg_msg *m, struct vg_plan *plan, char *err, size_t errsz)
{
    memset(plan, 0, sizeof(*plan));
    plan->preload_host = "";
    size_t pos = 0, klen, cap = 0;
    const char *k, *v;
    struct vg_mount *cur = NULL;
#define IS(name) (klen == sizeof(name) - 1 && memcmp(k, name, klen) == 0)
    while (vg_msg_next(m, &pos, &k, &klen, &v)) {
        if (IS("rootfs")) {
            plan->rootfs = v;
        } else if (IS("preload_host")) {
            plan->preload_host = v;
        } else if (IS("preload_line")) {
            plan->preload_line = v;
        } else if (IS("mount")) {
            if (plan->n_mounts == cap) {
                cap = cap ? cap * 2 : 8;
                struct vg_mount *more = realloc(plan->mounts, cap * sizeof(*more));
                if (more == NULL) {
                    snprintf(err, errsz, "out of memory");
                    return -1;
                }
                plan->mounts = more;
            }
            cur = &plan->mounts[plan->n_mounts++];
            *cur = (struct vg_mount){.read_only = 1, .src_fd = -1};
            char opts[64];
            vg_strlcpy(opts, v, sizeof(opts));
            char *save = NULL;
            for (char *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
                if (strcmp(o, "rw") == 0)
                    cur->read_only = 0;
                else if (strcmp(o, "dev") == 0)
                    cur->device = 1;
                else if (strcmp(o, "exec") == 0)
                    cur->executable = 1;
                else {
                    snprintf(err, errsz, "vgpud's mount plan has an unknown option %s", o);
                    return -1;
                }
            }
        } else if (IS("source") && cur != NULL) {
            cur->source = v;
        } else if (IS("target") && cur != NULL) {
            cur->target = v;
        }
    }
#undef IS
    if (plan->rootfs == NULL || plan->rootfs[0] != '/' || plan->preload_line == NULL) {
        snprintf(err, errsz, "vgpud's mount plan has no rootfs");
        return -1;
    }
    for (size_t i = 0; i < plan->n_mounts; i++) {
        const struct vg_mount *mm = &plan->mounts[i];
        if (mm->source == NULL || mm->target == NULL || mm->target[0] != '/') {
            snprintf(err, errsz, "vgpud's mount plan has an incomplete mount");
            return -1;
        }
    }
    return 0;
}

int vg_plan_open_sources(struct vg_plan *plan, char *err, size_t errsz)
{
    for (size_t i = 0; i < plan->n_mounts; i++) {
        struct vg_mount *m = &plan->mounts[i];
        long fd = syscall(SYS_open_tree, AT_FDCWD, m->source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (fd < 0 && errno == ENOSYS)
            return 0; /* an old kernel: bind_one opens the paths inside the namespace */
        if (fd < 0 && errno == ENOENT)
            continue; /* made by vg_plan_apply (the generated ld.so.preload): by path */
        if (fd < 0) {
            snprintf(err, errsz, "failed to open %s: %s", m->source, strerror(errno));
            return -1;
        }
        m->src_fd = (int)fd;
    }
    return 0;
}

void vg_plan_free(struct vg_plan *plan)
{
    for (size_t i = 0; i < plan->n_mounts; i++)
        if (plan->mounts[i].src_fd >= 0)
            close(plan->mounts[i].src_fd);
    free(plan->mounts);
    plan->mounts = NULL;
    plan->n_mounts = 0;
}
