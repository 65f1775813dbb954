/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-runtime / vgpu-hook / containerd-shim-vgpu-v2: shared helpers.
 *
 * The programs decide nothing about requests: vgpud does, over its lifecycle socket.
 * What they need themselves: the few config keys they read (a small scanner for the
 * YAML block form; any other form is refused with one line naming the file and the
 * key), where vgpud's lifecycle socket is, and how long to wait for it. */
#ifndef VG_COMMON_H
#define VG_COMMON_H

#include <stddef.h>

#include "vg_defaults.h"

#define VG_PATH_MAX 4096
#define VG_ERR_MAX 8192       /* one error line */
#define VG_WHY_MAX 6144       /* its cause, put into a line */
#define VG_CONFIG_MAX (1u << 20)

/* All of `fd` until EOF (NUL-terminated, *len without the NUL) or NULL with errno set;
 * over `max` bytes fails with EFBIG. free() the result. */
char *vg_read_fd(int fd, size_t max, size_t *len);

/* The same for the file at `path`. */
char *vg_read_file(const char *path, size_t max, size_t *len);

/* `message` as one line in `out`: "vgpu: " in front unless it is there, line breaks
 * made spaces (the engine shows one line). */
void vg_line(char *out, size_t n, const char *message);

/* vg_line's line on stderr. */
void vg_say(const char *message);

/* Copy with truncation; always NUL-terminates. */
void vg_strlcpy(char *dst, const char *src, size_t n);

/* The directory this program's file is in (symlinks resolved); -1 if unknown. */
int vg_self_dir(char *out, size_t n);

/* The vgpu config as the programs read it: $VGPU_CONFIG, else the default path;
 * a missing file means every default. */
struct vg_config {
    const char *path;
    char *text;           /* NULL: no file */
};

/* 0, or -1 with `err` set (a file that exists but cannot be read). */
int vg_config_load(struct vg_config *c, char *err, size_t errsz);
void vg_config_free(struct vg_config *c);

/* `section.key` of the config, from the block form only:
 *     section:
 *       key: value   # comment      (plain, or quoted without escapes)
 * 1: found (value in out), 0: absent, -1: a form the scanner does not read, with
 * `err` one line naming the file and the key. */
int vg_config_get(const struct vg_config *c, const char *section, const char *key, char *out,
                  size_t n, char *err, size_t errsz);

/* hook.wait_s in milliseconds (default VG_DEFAULT_WAIT_S); -1 with `err` set. */
int vg_config_wait_ms(const struct vg_config *c, int *ms, char *err, size_t errsz);

/* vgpud's lifecycle socket: $VGPU_LIFECYCLE_SOCKET, else ($VGPU_SOCKET, else the
 * config's paths.socket, else paths.run_dir/vgpud.sock, else /run/vgpu/vgpud.sock)
 * + ".lifecycle". 0, or -1 with `err` set. */
int vg_lifecycle_path(const struct vg_config *c, char *out, size_t n, char *err, size_t errsz);

#endif
