/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fileops.c: libvgpu-fileops.so, a list of file operations run in one call.
 *
 * vgpud makes a slice's files when it is allocated and removes them when it is released:
 * a directory, its own tmpfs, the region, usage and .req files, the .req's bind mount in
 * the scheduling directory, the .conf, and at the end the unmounts. Made from Python,
 * that is some twenty system calls, and each one lets go of the GIL and waits to get it
 * back behind vgpud's other threads (the RPC workers, gRPC's own, the store's writer):
 * on a 2-CPU node those hand-offs cost more than the calls (bench/arbiter.py,
 * docs/performance.md). arbiter.files.fileops builds the list (what to make, with which
 * bytes: the rules stay in Python) and hands it here in one call, which lets go of the
 * GIL once. This file decides nothing: it runs the operations in order, stops at the
 * first that fails and says which, with its errno.
 *
 * fileops.h holds the interface, which arbiter.files.fileops mirrors (a test holds the two
 * to one layout); vg_fileops_abi() says the struct's size and the version, and the loader
 * refuses a library that disagrees.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fileops.h"

#define VG_EXPORT __attribute__((visibility("default")))

/* The file's bytes, magic last, in its mode (fchmod: the umask does not apply). */
static int fill(int fd, const struct vg_fileop *o)
{
    if (fchmod(fd, o->mode) != 0)
        return -1;
    uint64_t done = 0;
    while (done < o->len) {
        ssize_t n = pwrite(fd, (const char *)o->data + done, o->len - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        done += (uint64_t)n;
    }
    if (o->last_off < 0)
        return 0;
    ssize_t n = pwrite(fd, &o->last, sizeof o->last, (off_t)o->last_off);
    if (n == (ssize_t)sizeof o->last)
        return 0;
    if (n >= 0)
        errno = EIO; /* a short write of 4 bytes: a full tmpfs */
    return -1;
}

/* A kept file's fd and inode (what arbiter.files.leases holds), else closed. */
static int keep_or_close(int fd, struct vg_fileop *o)
{
    if (!(o->flags & VG_FILEOP_KEEP))
        return close(fd);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    o->fd = fd;
    o->ino = (uint64_t)st.st_ino;
    return 0;
}

static int create_excl(const char *path)
{
    return open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

static int write_at(struct vg_fileop *o)
{
    int fd = create_excl(o->path);
    if (fd < 0)
        return -1;
    if (fill(fd, o) == 0 && keep_or_close(fd, o) == 0)
        return 0;
    int e = errno;
    close(fd);
    unlink(o->path);
    errno = e;
    return -1;
}

static int write_beside(struct vg_fileop *o)
{
    char tmp[4096];
    int fd = -1;
    for (int n = 0; n < VG_TEMP_TRIES && fd < 0; n++) {
        if (snprintf(tmp, sizeof tmp, "%s%d.tmp", o->aux, n) >= (int)sizeof tmp) {
            errno = ENAMETOOLONG;
            return -1;
        }
        fd = create_excl(tmp);
        if (fd < 0 && errno != EEXIST)
            return -1;
    }
    if (fd < 0)
        return -1; /* EEXIST: no free name */
    if (fill(fd, o) == 0 && rename(tmp, o->path) == 0 && keep_or_close(fd, o) == 0)
        return 0;
    int e = errno;
    close(fd);
    unlink(tmp);
    errno = e;
    return -1;
}

static int detach(const char *path)
{
    if (umount2(path, MNT_DETACH) == 0 || errno == EINVAL || errno == ENOENT)
        return 0;
    return -1;
}

/* Unmount and delete what is at path, for a name that must be made anew. */
static int clear(const char *path)
{
    if (detach(path) != 0)
        return -1;
    return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
}

static int mknod_reg(const struct vg_fileop *o)
{
    /* The raw call: glibc's mknod is a 2.33 symbol (an inline wrapper before). */
    return (int)syscall(SYS_mknodat, AT_FDCWD, o->path, (mode_t)(S_IFREG | o->mode), 0);
}

static int mknod_bind(const struct vg_fileop *o)
{
    if (mknod_reg(o) != 0 && (errno != EEXIST || clear(o->path) != 0 || mknod_reg(o) != 0))
        return -1;
    if (mount(o->aux, o->path, NULL, MS_BIND, NULL) == 0)
        return 0;
    int e = errno;
    unlink(o->path);
    errno = e;
    return -1;
}

static int run_one(struct vg_fileop *o)
{
    switch (o->op) {
    case VG_OP_MKDIR:
        return mkdir(o->path, (mode_t)o->mode) == 0 ? chmod(o->path, (mode_t)o->mode) : -1;
    case VG_OP_MOUNT_TMPFS:
        return mount("vgpu-slice", o->path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, o->aux);
    case VG_OP_WRITE_AT:
        return write_at(o);
    case VG_OP_WRITE_BESIDE:
        return write_beside(o);
    case VG_OP_MKNOD_BIND:
        return mknod_bind(o);
    case VG_OP_LINK:
        if (link(o->aux, o->path) == 0)
            return 0;
        return errno == EEXIST && clear(o->path) == 0 ? link(o->aux, o->path) : -1;
    case VG_OP_DETACH:
        return detach(o->path);
    case VG_OP_UNLINK:
        return unlink(o->path) == 0 || errno == ENOENT ? 0 : -1;
    case VG_OP_RMDIR:
        return rmdir(o->path);
    case VG_OP_CLOSE:
        return close(o->fd);
    case VG_OP_IS_FILE: {
        struct stat st;
        if (stat(o->path, &st) != 0)
            return -1;
        if (S_ISREG(st.st_mode))
            return 0;
        errno = EINVAL;
        return -1;
    }
    }
    errno = EINVAL;
    return -1;
}

/* Runs ops[0..n) in order; returns the index of the first that failed (its err set; what
 * it made is undone, what the ones before it made stays, kept fds open), or n. */
VG_EXPORT int vg_fileops_run(struct vg_fileop *ops, int n)
{
    for (int i = 0; i < n; i++) {
        ops[i].err = 0;
        errno = 0;
        if (run_one(&ops[i]) != 0) {
            ops[i].err = errno ? errno : EIO;
            return i;
        }
    }
    return n;
}

/* sizeof(struct vg_fileop) in the high half, VG_FILEOPS_VERSION in the low. */
VG_EXPORT uint32_t vg_fileops_abi(void)
{
    return (uint32_t)sizeof(struct vg_fileop) << 16 | VG_FILEOPS_VERSION;
}
