/* SPDX-License-Identifier: Apache-2.0 */
/* vgpu-runtime / vgpu-hook (compiled fast path): shared helpers.
 *
 * The programs decide nothing about requests: vgpud does (shim/fastpath.py) over its
 * lifecycle socket. What they need themselves: where that socket is, the few config
 * keys the pass-through reads, the one-line error, and the way back to the Python
 * implementation (`python -m shim` / `-m oci_hook`), which is complete and is run
 * whenever the fast path cannot decide. */
#ifndef VG_COMMON_H
#define VG_COMMON_H

#include <stddef.h>

#define VG_DEFAULT_CONFIG "/etc/vgpu/config.yaml"
#define VG_DEFAULT_RUN_DIR "/run/vgpu"
#define VG_SOCKET_NAME "vgpud.sock"
#define VG_LIFECYCLE_SUFFIX ".lifecycle"
#define VG_PATH_MAX 4096

/* The whole file (NUL-terminated, *len without the NUL) or NULL with errno set;
 * files over `max` bytes fail with EFBIG. free() the result. */
char *vg_read_file(const char *path, size_t max, size_t *len);

/* `key` of the top-level block `section` of a YAML config, read by a small scanner
 * for the common block form only (what configured_lower in shim/runtime.py reads):
 *     section:
 *       key: value   # comment
 * 1: found (value in out), 0: absent, -1: a form the scanner does not follow (the
 * caller falls back to Python, which reads YAML). */
int vg_cfg_get(const char *text, const char *section, const char *key, char *out, size_t n);

/* The config file the Python path would read: $VGPU_CONFIG or the default. */
const char *vg_config_path(void);

/* The lifecycle socket of the vgpud the Python path would talk to:
 * $VGPU_LIFECYCLE_SOCKET, else ($VGPU_SOCKET, else the config's paths.socket, else
 * paths.run_dir/vgpud.sock, else /run/vgpu/vgpud.sock) + ".lifecycle".
 * 0: found; -1: the config cannot be read simply (fall back to Python). */
int vg_lifecycle_path(char *out, size_t n);

/* Replace this process with `<python> -m <module> args...`; `stdin_data`, when not
 * NULL, becomes its stdin (the hook has read the OCI state already). The
 * interpreter: $VGPU_PYTHON, else the first line of `vgpu-python` beside this
 * program (its second line, if any, is prepended to PYTHONPATH: a checkout), else
 * python3 on PATH. Returns only on failure, after printing one line. */
void vg_exec_python(const char *module, int argc, char **argv, const char *stdin_data,
                    size_t stdin_len);

/* Copy with truncation; always NUL-terminates. */
void vg_strlcpy(char *dst, const char *src, size_t n);

#endif
