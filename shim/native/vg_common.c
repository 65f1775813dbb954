/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_common.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void vg_strlcpy(char *dst, const char *src, size_t n)
{
    if (n == 0)
        return;
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

char *vg_read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 8192, used = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL)
        goto fail;
    for (;;) {
        if (used == cap) {
            if (cap >= max) {
                errno = EFBIG;
                goto fail;
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *bigger = realloc(buf, cap + 1);
            if (bigger == NULL)
                goto fail;
            buf = bigger;
        }
        ssize_t got = read(fd, buf + used, cap - used);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            goto fail;
        }
        if (got == 0)
            break;
        used += (size_t)got;
    }
    close(fd);
    buf[used] = '\0';
    if (len != NULL)
        *len = used;
    return buf;
fail:;
    int saved = errno;
    free(buf);
    close(fd);
    errno = saved;
    return NULL;
}

/* One line of `text` from *pos: [start, end) without the newline; false at the end. */
static int next_line(const char *text, size_t *pos, const char **start, size_t *len)
{
    if (text[*pos] == '\0')
        return 0;
    *start = text + *pos;
    const char *nl = strchr(*start, '\n');
    *len = nl ? (size_t)(nl - *start) : strlen(*start);
    *pos += *len + (nl ? 1 : 0);
    if (*len && (*start)[*len - 1] == '\r')
        (*len)--;
    return 1;
}

static size_t indent_of(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && s[i] == ' ')
        i++;
    return i;
}

/* `s` (len bytes) without a trailing comment (" #...") and surrounding spaces. */
static void plain_value(const char *s, size_t len, const char **out, size_t *out_len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if ((s[i] == ' ' || s[i] == '\t') && s[i + 1] == '#') {
            len = i;
            break;
        }
    }
    while (len && isspace((unsigned char)*s)) {
        s++;
        len--;
    }
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    *out = s;
    *out_len = len;
}

int vg_cfg_get(const char *text, const char *section, const char *key, char *out, size_t n)
{
    size_t pos = 0, len, slen = strlen(section), klen = strlen(key);
    const char *line;
    int in_block = 0;
    size_t block_indent = 0;
    while (next_line(text, &pos, &line, &len)) {
        if (memchr(line, '\t', len))
            return -1;            /* YAML forbids tabs for indentation: let yaml say so */
        size_t ind = indent_of(line, len);
        if (ind == len || line[ind] == '#')
            continue;             /* blank or comment */
        if (ind == 0) {
            if (in_block)
                return 0;         /* the next top-level key: no `key` */
            if (line[0] == '%' || (len >= 3 && strncmp(line, "---", 3) == 0))
                return -1;        /* directives, several documents */
            if (len > slen && strncmp(line, section, slen) == 0) {
                size_t i = slen;
                while (i < len && line[i] == ' ')
                    i++;
                if (i < len && line[i] == ':') {
                    const char *rest;
                    size_t rest_len;
                    plain_value(line + i + 1, len - i - 1, &rest, &rest_len);
                    if (rest_len)
                        return -1;  /* flow style or an anchor on the section */
                    in_block = 1;
                    block_indent = 0;
                }
            }
            continue;
        }
        if (!in_block)
            continue;
        if (block_indent == 0)
            block_indent = ind;
        if (ind != block_indent)
            continue;             /* deeper: a nested map's keys, not this block's */
        if (len - ind > klen && strncmp(line + ind, key, klen) == 0 && line[ind + klen] == ':') {
            const char *v;
            size_t vlen;
            plain_value(line + ind + klen + 1, len - ind - klen - 1, &v, &vlen);
            if (vlen == 0 || strchr("'\"&*!|>{[%@`", v[0]) != NULL || vlen >= n)
                return -1;
            memcpy(out, v, vlen);
            out[vlen] = '\0';
            return 1;
        }
    }
    return 0;
}

const char *vg_config_path(void)
{
    const char *c = getenv("VGPU_CONFIG");
    return c && *c ? c : VG_DEFAULT_CONFIG;
}

int vg_lifecycle_path(char *out, size_t n)
{
    const char *explicit_path = getenv("VGPU_LIFECYCLE_SOCKET");
    if (explicit_path && *explicit_path) {
        vg_strlcpy(out, explicit_path, n);
        return 0;
    }
    char sock[VG_PATH_MAX];
    const char *env = getenv("VGPU_SOCKET");
    if (env && *env) {
        vg_strlcpy(sock, env, sizeof(sock));
    } else {
        char *text = vg_read_file(vg_config_path(), 1 << 20, NULL);
        if (text == NULL && errno != ENOENT)
            return -1;
        int r = text ? vg_cfg_get(text, "paths", "socket", sock, sizeof(sock)) : 0;
        if (r == 0) {
            char run[VG_PATH_MAX];
            int rr = text ? vg_cfg_get(text, "paths", "run_dir", run, sizeof(run)) : 0;
            if (rr == 0)
                vg_strlcpy(run, VG_DEFAULT_RUN_DIR, sizeof(run));
            if (rr < 0 || snprintf(sock, sizeof(sock), "%s/%s", run, VG_SOCKET_NAME)
                              >= (int)sizeof(sock))
                r = -1;
            else
                r = 1;
        }
        free(text);
        if (r < 0 || sock[0] != '/')
            return -1;            /* relative paths: the Python config resolves them */
    }
    if (snprintf(out, n, "%s%s", sock, VG_LIFECYCLE_SUFFIX) >= (int)n)
        return -1;
    return 0;
}

/* The interpreter (and a PYTHONPATH entry) from `vgpu-python` beside this program. */
static int sidecar_python(char *python, size_t n, char *pythonpath, size_t pn)
{
    char exe[VG_PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0)
        return -1;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return -1;
    char path[VG_PATH_MAX];
    snprintf(path, sizeof(path), "%.*s/vgpu-python", (int)(slash - exe), exe);
    char *text = vg_read_file(path, 1 << 16, NULL);
    if (text == NULL)
        return -1;
    size_t pos = 0, llen;
    const char *line;
    python[0] = pythonpath[0] = '\0';
    if (next_line(text, &pos, &line, &llen) && llen < n) {
        memcpy(python, line, llen);
        python[llen] = '\0';
    }
    if (next_line(text, &pos, &line, &llen) && llen < pn) {
        memcpy(pythonpath, line, llen);
        pythonpath[llen] = '\0';
    }
    free(text);
    return python[0] == '/' && access(python, X_OK) == 0 ? 0 : -1;
}

/* Make `data` this process's stdin (a memfd: no pipe-size limit, no writer to wait for). */
static int restore_stdin(const char *data, size_t len)
{
    int fd = memfd_create("vgpu-hook-state", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, STDIN_FILENO) < 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

void vg_exec_python(const char *module, int argc, char **argv, const char *stdin_data,
                    size_t stdin_len)
{
    char python[VG_PATH_MAX] = "python3", pythonpath[VG_PATH_MAX] = "";
    const char *env = getenv("VGPU_PYTHON");
    if (env && *env)
        vg_strlcpy(python, env, sizeof(python));
    else if (sidecar_python(python, sizeof(python), pythonpath, sizeof(pythonpath)) != 0)
        vg_strlcpy(python, "python3", sizeof(python));
    if (pythonpath[0]) {
        const char *old = getenv("PYTHONPATH");
        char joined[2 * VG_PATH_MAX];
        snprintf(joined, sizeof(joined), "%s%s%s", pythonpath, old && *old ? ":" : "",
                 old && *old ? old : "");
        setenv("PYTHONPATH", joined, 1);
    }
    if (stdin_data != NULL && restore_stdin(stdin_data, stdin_len) != 0) {
        fprintf(stderr, "vgpu: failed to run the Python %s: cannot pass the state on: %s\n",
                module, strerror(errno));
        return;
    }
    char **args = calloc((size_t)argc + 4, sizeof(*args));
    if (args == NULL) {
        fprintf(stderr, "vgpu: failed to run the Python %s: out of memory\n", module);
        return;
    }
    args[0] = python;
    args[1] = "-m";
    args[2] = (char *)module;
    for (int i = 0; i < argc; i++)
        args[3 + i] = argv[i];
    execvp(python, args);
    fprintf(stderr, "vgpu: failed to run the Python %s: cannot exec %s: %s "
            "(set VGPU_PYTHON to the interpreter vgpu is installed in)\n",
            module, python, strerror(errno));
    free(args);
}
