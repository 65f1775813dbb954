/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fileops.h: the interface of libvgpu-fileops.so (fileops.c), mirrored by
 * arbiter/files/fileops.py: struct vg_fileop by its ctypes _COp, the numbers by its
 * constants (tests/arbiter/files/test_fileops.py compiles against this header).
 */
#ifndef VG_FILEOPS_H
#define VG_FILEOPS_H

#include <stdint.h>

/* The operations; arbiter.files.fileops numbers them alike (MKDIR ... CLOSE). */
enum vg_fileop_kind {
    VG_OP_MKDIR = 1,      /* mkdir(path, mode), then chmod: the mode without the umask */
    VG_OP_MOUNT_TMPFS,    /* a tmpfs at path (nosuid, nodev, noexec), aux: its options */
    VG_OP_WRITE_AT,       /* a new file at path itself (O_EXCL): data, then `last` */
    VG_OP_WRITE_BESIDE,   /* the same under a new name aux<n>.tmp, then renamed to path */
    VG_OP_MKNOD_BIND,     /* an empty file at path with aux bind-mounted onto it (*) */
    VG_OP_LINK,           /* path, a hard link to aux (*) */
    VG_OP_DETACH,         /* lazy unmount of path; nothing mounted there is no failure */
    VG_OP_UNLINK,         /* unlink path; already gone is no failure */
    VG_OP_RMDIR,          /* rmdir path */
    VG_OP_CLOSE,          /* close fd */
    VG_OP_IS_FILE,        /* path is a regular file: else stat's errno, EINVAL: another type */
};
/* (*) Whatever is at path already (a stale file of the same name, or one mounted there)
 * is unmounted and deleted first: the name is the slice's own, derived from its id. */

#define VG_FILEOP_KEEP 0x1   /* a WRITE's file stays open: fd and ino are set */
#define VG_FILEOPS_VERSION 2u
#define VG_TEMP_TRIES 1000   /* as arbiter.files.atomic's: a stale name is skipped */

struct vg_fileop {
    int32_t op;         /* enum vg_fileop_kind */
    int32_t fd;         /* out: a kept file's fd; in: CLOSE's */
    const char *path;
    const char *aux;    /* MOUNT_TMPFS: options; WRITE_BESIDE: temp prefix; MKNOD_BIND, LINK: source */
    const void *data;   /* WRITE_*: the file's bytes */
    uint64_t len;
    uint64_t ino;       /* out: a kept file's inode */
    int64_t last_off;   /* WRITE_*: where `last` goes, written after data; -1: nowhere */
    uint32_t last;      /* a header's magic: the file is whole once it is there */
    uint32_t mode;
    uint32_t flags;     /* VG_FILEOP_KEEP */
    int32_t err;        /* out: errno of the operation that failed */
};

/* Runs ops[0..n) in order; returns the index of the first that failed (its err set; what
 * it made is undone, what the ones before it made stays, kept fds open), or n. */
int vg_fileops_run(struct vg_fileop *ops, int n);

/* sizeof(struct vg_fileop) in the high half, VG_FILEOPS_VERSION in the low. */
uint32_t vg_fileops_abi(void);

#endif
