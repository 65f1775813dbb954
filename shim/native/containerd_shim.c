/* SPDX-License-Identifier: Apache-2.0 */
/* containerd-shim-vgpu-v2: the runtime io.containerd.vgpu.v2 (ctr --runtime, CRI
 * runtime classes).
 *
 * containerd runs containerd-shim-<name>-v2 from its PATH. We exec containerd's own
 * runc shim (containerd-shim-runc-v2, found on PATH, never this program) with the same
 * argv, with our private bin dir first on PATH and named in $VGPU_SHIM_BIN: that dir's
 * `runc` is vgpu-runtime, so every runc call the shim makes (create, start, kill,
 * delete...) goes through vgpu-runtime, which skips the dir when it looks for the real
 * runc. The runc shim re-executes itself as the long-running shim daemon and keeps
 * this environment, so the daemon's runc calls go the same way.
 * The private dir is beside this program's file: build/bin/shim in a checkout,
 * arbiter/native/bin/shim in the package. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vg_common.h"
#include "vg_exec.h"

#define NAME "containerd-shim-vgpu-v2"

static int fail(const char *why)
{
    /* containerd shows the shim's stderr when the shim does not start. */
    fprintf(stderr, NAME ": failed to start: %s\n", why);
    return 1;
}

/* PATH with `dir` first and nowhere else. */
static char *path_with_first(const char *dir)
{
    const char *old = getenv("PATH");
    if (old == NULL)
        old = "/usr/local/bin:/usr/bin:/bin";
    size_t cap = strlen(dir) + strlen(old) + 2;
    char *out = malloc(cap), *copy = strdup(old);
    if (out == NULL || copy == NULL) {
        free(out);
        free(copy);
        return NULL;
    }
    vg_strlcpy(out, dir, cap);
    for (char *entry = copy, *next; entry; entry = next) {
        next = strchr(entry, ':');
        if (next)
            *next++ = '\0';
        char real[PATH_MAX];
        if (realpath(*entry ? entry : ".", real) != NULL && strcmp(real, dir) == 0)
            continue;
        strcat(out, ":");
        strcat(out, entry);
    }
    free(copy);
    return out;
}

int main(int argc, char **argv)
{
    (void)argc;
    char dir[VG_PATH_MAX], guess[VG_PATH_MAX + 16], priv[PATH_MAX], runc[VG_PATH_MAX + 32];
    char shim[VG_PATH_MAX], why[VG_ERR_MAX];
    if (vg_self_dir(dir, sizeof(dir)) != 0)
        return fail("cannot find the directory of its own file (/proc/self/exe)");
    snprintf(guess, sizeof(guess), "%s/%s", dir, VG_SHIM_BIN_DIR);
    snprintf(runc, sizeof(runc), "%s/runc", guess);
    if (realpath(guess, priv) == NULL || !vg_is_executable(runc)) {
        snprintf(why, sizeof(why), "%s is missing or not executable (vgpu-runtime as runc: "
                 "run make, or reinstall vgpu)", runc);
        return fail(why);
    }
    const char *skip[] = {priv, NULL};
    if (vg_path_search(VG_RUNC_SHIM, skip, shim, sizeof(shim)) != 0)
        return fail(VG_RUNC_SHIM " is not on PATH (install containerd)");
    char *path = path_with_first(priv);
    if (path == NULL || setenv("PATH", path, 1) != 0 || setenv("VGPU_SHIM_BIN", priv, 1) != 0)
        return fail("out of memory");
    free(path);
    argv[0] = shim;
    execv(shim, argv);
    snprintf(why, sizeof(why), "cannot exec %s: %s", shim, strerror(errno));
    return fail(why);
}
