/* SPDX-License-Identifier: Apache-2.0 */
/* Finding and exec'ing the program we stand in front of (runc, nvidia-container-runtime,
 * containerd-shim-runc-v2): never ourselves, never through containerd-shim-vgpu-v2's
 * private bin dir (whose runc is vgpu-runtime). */
#ifndef VG_EXEC_H
#define VG_EXEC_H

#include <stddef.h>

/* Set to our pid just before the exec: seeing it again with the same pid means the
 * chain came back to us (an exec keeps the pid), and we stop instead of looping. */
#define VG_EXEC_GUARD_ENV "VGPU_RUNTIME_EXEC_PID"

/* `name` on $PATH as execvp looks it up, skipping the directories in `skip` (real
 * paths, NULL-terminated list, "" entries ignored) and any file that is this program
 * (same inode as /proc/self/exe). 0 with the absolute path in `out`, else -1. */
int vg_path_search(const char *name, const char *const *skip, char *out, size_t n);

/* Is `path` this program's own file? */
int vg_is_self(const char *path);

/* Is `path` a regular file we may execute? */
int vg_is_executable(const char *path);

/* Replace this process with `path`, argv[1..] untouched (argv[0] becomes `path`);
 * returns only on failure, with `err` saying why (one line, no prefix). */
void vg_exec_guarded(const char *path, char **argv, char *err, size_t errsz);

#endif
