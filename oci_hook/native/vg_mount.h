/* SPDX-License-Identifier: Apache-2.0 */
/* Apply a mount plan (oci_hook/mounts.py's Plan, as vgpud answers it) inside a
 * container's rootfs (the only mount implementation; vgpud only plans). Every
 * target is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so a
 * symlink planted by the image resolves as if the rootfs were / and never leads
 * out of it; missing directories and files are made with mkdirat/openat(O_EXCL |
 * O_NOFOLLOW) relative to a directory resolved that way; the bind goes onto
 * /proc/self/fd/<fd> of the resolved target (as runc does), then a read-only /
 * nosuid / nodev / noexec remount as the entry asks; a failure undoes the mounts made. */
#ifndef VG_MOUNT_H
#define VG_MOUNT_H

#include <stddef.h>
#include <sys/types.h>

#include "vg_msg.h"

struct vg_mount {
    const char *source;      /* host path */
    const char *target;      /* path inside the container */
    int read_only;
    int device;              /* a device node: keep it usable (no nodev) */
    int executable;          /* a library the loader maps (no noexec) */
    int src_fd;              /* a detached copy of the source's mount (open_tree), or -1 */
};

struct vg_plan {
    const char *rootfs;
    const char *preload_host; /* where to write the generated ld.so.preload ("" = none) */
    const char *preload_line; /* the line it starts with */
    struct vg_mount *mounts;
    size_t n_mounts;
};

/* The plan in vgpud's `status=mount` answer (pointers into `m`); -1 with `err` set. */
int vg_plan_parse(const struct vg_msg *m, struct vg_plan *plan, char *err, size_t errsz);
void vg_plan_free(struct vg_plan *plan);

/* Take every source as a detached copy of its mount (open_tree), here, in the host's
 * mount namespace: a mount vgpud made after the container's namespace was copied from
 * the host's (a slice's own size-bounded tmpfs) is then mounted in the container too,
 * whatever the engine's rootfs propagation. On a kernel without open_tree (before 5.2)
 * the sources are opened by path inside the container's namespace, as before. */
int vg_plan_open_sources(struct vg_plan *plan, char *err, size_t errsz);

/* Enter the mount namespace of `pid` (this process must be single-threaded). */
int vg_enter_mount_ns(pid_t pid, char *err, size_t errsz);

/* Do the plan in the current mount namespace; on failure undo every mount made and
 * say why in `err` (one line). */
int vg_plan_apply(const struct vg_plan *plan, char *err, size_t errsz);

#endif
