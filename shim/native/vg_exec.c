/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_exec.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vg_common.h"

int vg_is_self(const char *path)
{
    struct stat self, st;
    return stat("/proc/self/exe", &self) == 0 && stat(path, &st) == 0 &&
           st.st_dev == self.st_dev && st.st_ino == self.st_ino;
}

int vg_is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static int skipped(const char *dir, const char *const *skip)
{
    char real[PATH_MAX];
    if (skip == NULL || realpath(dir, real) == NULL)
        return 0;
    for (; *skip; skip++)
        if ((*skip)[0] && strcmp(real, *skip) == 0)
            return 1;
    return 0;
}

int vg_path_search(const char *name, const char *const *skip, char *out, size_t n)
{
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/usr/local/bin:/usr/bin:/bin");
    if (copy == NULL)
        return -1;
    char cwd[VG_PATH_MAX] = "";
    int found = 0;
    for (char *entry = copy, *next; entry && !found; entry = next) {
        next = strchr(entry, ':');
        if (next)
            *next++ = '\0';
        const char *dir = *entry ? entry : ".";   /* an empty entry is the cwd, as execvp */
        if (skipped(dir, skip))
            continue;
        char candidate[VG_PATH_MAX];
        int len;
        if (dir[0] == '/') {
            len = snprintf(candidate, sizeof(candidate), "%s/%s", dir, name);
        } else {
            if (!cwd[0] && getcwd(cwd, sizeof(cwd)) == NULL)
                continue;
            len = snprintf(candidate, sizeof(candidate), "%s/%s/%s", cwd, dir, name);
        }
        if (len >= (int)sizeof(candidate) || (size_t)len >= n || !vg_is_executable(candidate) ||
            vg_is_self(candidate))
            continue;
        vg_strlcpy(out, candidate, n);
        found = 1;
    }
    free(copy);
    return found ? 0 : -1;
}

void vg_exec_guarded(const char *path, char **argv, char *err, size_t errsz)
{
    char mark[32];
    snprintf(mark, sizeof(mark), "%d", (int)getpid());
    const char *seen = getenv(VG_EXEC_GUARD_ENV);
    if (seen && strcmp(seen, mark) == 0) {
        snprintf(err, errsz, "%s execs this program again (a loop)", path);
        return;
    }
    setenv(VG_EXEC_GUARD_ENV, mark, 1);
    argv[0] = (char *)path;
    execv(path, argv);
    snprintf(err, errsz, "cannot exec %s: %s", path, strerror(errno));
}
