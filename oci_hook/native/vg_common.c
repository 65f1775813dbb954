/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_common.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_MAX_S 86400.0    /* keeps the milliseconds inside an int */

void vg_strlcpy(char *dst, const char *src, size_t n)
{
    if (n == 0)
        return;
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

char *vg_read_fd(int fd, size_t max, size_t *len)
{
    size_t cap = 8192, used = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL)
        return NULL;
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
    buf[used] = '\0';
    if (len != NULL)
        *len = used;
    return buf;
fail:;
    int saved = errno;
    free(buf);
    errno = saved;
    return NULL;
}

char *vg_read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *text = vg_read_fd(fd, max, len);
    int saved = errno;
    close(fd);
    errno = saved;
    return text;
}

void vg_line(char *out, size_t n, const char *message)
{
    snprintf(out, n, "%s%s", strncmp(message, "vgpu: ", 6) == 0 ? "" : "vgpu: ", message);
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

void vg_say(const char *message)
{
    char line[VG_ERR_MAX];
    vg_line(line, sizeof(line), message);
    fprintf(stderr, "%s\n", line);
}

int vg_self_dir(char *out, size_t n)
{
    char exe[PATH_MAX];
    if (realpath("/proc/self/exe", exe) == NULL)
        return -1;
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    if (strlen(exe) >= n)
        return -1;
    vg_strlcpy(out, exe[0] ? exe : "/", n);
    return 0;
}

/* --- the config ------------------------------------------------------------------ */

int vg_config_load(struct vg_config *c, char *err, size_t errsz)
{
    const char *env = getenv("VGPU_CONFIG");
    c->path = env && *env ? env : VG_DEFAULT_CONFIG;
    c->text = vg_read_file(c->path, VG_CONFIG_MAX, NULL);
    if (c->text == NULL && errno != ENOENT) {
        snprintf(err, errsz, "vgpu: failed to read config %s: %s", c->path, strerror(errno));
        return -1;
    }
    return 0;
}

void vg_config_free(struct vg_config *c)
{
    free(c->text);
    c->text = NULL;
}

/* One line of `text` from *pos: [start, start + len) without the newline; 0 at the end. */
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

/* `s` without a trailing comment (" #...") and surrounding blanks. */
static void trim_value(const char *s, size_t len, const char **out, size_t *out_len)
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

/* A scalar: plain, or quoted without escapes ("..." without \, '...' without '').
 * 0 with the text in out, -1 for any other form. */
static int scalar(const char *s, size_t len, char *out, size_t n)
{
    const char *v;
    size_t vlen;
    while (len && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    if (len && (s[0] == '"' || s[0] == '\'')) {
        while (len && isspace((unsigned char)s[len - 1]))
            len--;
        const char *close = memchr(s + 1, s[0], len - 1);
        if (close == NULL || memchr(s + 1, '\\', (size_t)(close - s - 1)) != NULL)
            return -1;
        trim_value(close + 1, len - (size_t)(close + 1 - s), &v, &vlen);
        if (vlen)
            return -1;    /* text after the closing quote (or a doubled quote) */
        v = s + 1;
        vlen = (size_t)(close - v);
    } else {
        trim_value(s, len, &v, &vlen);
        if (vlen == 0 || strchr("'\"&*!|>{[%@`#,", v[0]) != NULL ||
            ((v[0] == '-' || v[0] == '?') && (vlen == 1 || v[1] == ' ')))
            return -1;    /* null, a nested block, flow style, anchors, tags, a list... */
    }
    if (vlen >= n || memchr(v, '\0', vlen) != NULL)
        return -1;
    memcpy(out, v, vlen);
    out[vlen] = '\0';
    return 0;
}

/* Does the line at `s` begin with `word`, then blanks, then ':'? The rest after ':'. */
static const char *key_colon(const char *s, size_t len, const char *word)
{
    size_t wlen = strlen(word), i = wlen;
    if (len < wlen || strncmp(s, word, wlen) != 0)
        return NULL;
    while (i < len && s[i] == ' ')
        i++;
    if (i >= len || s[i] != ':' || (i + 1 < len && s[i + 1] != ' ' && s[i + 1] != '\t'))
        return NULL;
    return s + i + 1;
}

/* 1 found, 0 absent, -1 a form this scanner does not read. */
static int scan(const char *text, const char *section, const char *key, char *out, size_t n)
{
    size_t pos = 0, len, block_indent = 0;
    const char *line;
    int in_block = 0, content = 0;
    while (next_line(text, &pos, &line, &len)) {
        size_t ind = 0;
        while (ind < len && (line[ind] == ' ' || line[ind] == '\t')) {
            if (line[ind] == '\t')
                return -1;        /* YAML forbids tabs in indentation */
            ind++;
        }
        if (ind == len || line[ind] == '#')
            continue;             /* blank or comment */
        const char *s = line + ind;
        size_t slen = len - ind;
        if (ind == 0) {
            if (slen >= 3 && strncmp(s, "---", 3) == 0 && (slen == 3 || s[3] == ' ') &&
                !content) {
                content = 1;      /* the document's start marker */
                continue;
            }
            content = 1;
            if (in_block)
                return 0;         /* the next top-level key: no `key` in the section */
            if (strchr("\"'{[?&*!%.-|>", s[0]) != NULL)
                return -1;        /* quoted keys, flow style, directives, documents */
            const char *rest = key_colon(s, slen, section);
            if (rest != NULL) {
                const char *v;
                size_t vlen;
                trim_value(rest, slen - (size_t)(rest - s), &v, &vlen);
                if (vlen)
                    return -1;    /* `section: {...}` or an anchor on it */
                in_block = 1;
                block_indent = 0;
            }
            continue;
        }
        if (!in_block)
            continue;
        if (block_indent == 0)
            block_indent = ind;
        if (ind != block_indent)
            continue;             /* deeper: a nested map's keys, not this block's */
        if (strchr("\"'{[?&*!", s[0]) != NULL)
            return -1;            /* a quoted or complex key: could be ours */
        const char *rest = key_colon(s, slen, key);
        if (rest != NULL)
            return scalar(rest, slen - (size_t)(rest - s), out, n) == 0 ? 1 : -1;
    }
    return 0;
}

int vg_config_get(const struct vg_config *c, const char *section, const char *key, char *out,
                  size_t n, char *err, size_t errsz)
{
    if (c->text == NULL)
        return 0;
    int r = scan(c->text, section, key, out, n);
    if (r < 0)
        snprintf(err, errsz, "vgpu: failed to read config %s: %s.%s: a YAML form vgpu's "
                 "compiled programs do not read (write `%s:` and below it `  %s: <value>`, "
                 "a plain or quoted value without escapes)", c->path, section, key, section,
                 key);
    return r;
}

int vg_config_wait_ms(const struct vg_config *c, int *ms, char *err, size_t errsz)
{
    char text[64];
    int r = vg_config_get(c, "hook", "wait_s", text, sizeof(text), err, errsz);
    if (r < 0)
        return -1;
    double s = VG_DEFAULT_WAIT_S;
    if (r == 1) {
        char *end;
        errno = 0;
        s = strtod(text, &end);
        if (errno || end == text || *end != '\0' || !isfinite(s) || s < 0 || s > WAIT_MAX_S) {
            snprintf(err, errsz, "vgpu: failed to read config %s: hook.wait_s: '%s' is not a "
                     "number of seconds from 0 to %g", c->path, text, WAIT_MAX_S);
            return -1;
        }
    }
    *ms = (int)(s * 1000 + 0.5);
    return 0;
}

/* A path value of the config: absolute, or one line naming the key. */
static int config_path_value(const struct vg_config *c, const char *key, char *out, size_t n,
                             char *err, size_t errsz)
{
    int r = vg_config_get(c, "paths", key, out, n, err, errsz);
    if (r == 1 && out[0] != '/') {
        snprintf(err, errsz, "vgpu: failed to read config %s: paths.%s: '%s' is not an "
                 "absolute path", c->path, key, out);
        return -1;
    }
    return r;
}

int vg_lifecycle_path(const struct vg_config *c, char *out, size_t n, char *err, size_t errsz)
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
        int r = config_path_value(c, "socket", sock, sizeof(sock), err, errsz);
        if (r < 0)
            return -1;
        if (r == 0) {
            char run[VG_PATH_MAX] = VG_DEFAULT_RUN_DIR;
            if (config_path_value(c, "run_dir", run, sizeof(run), err, errsz) < 0)
                return -1;
            if (snprintf(sock, sizeof(sock), "%s/%s", run, VG_SOCKET_NAME) >= (int)sizeof(sock))
                goto too_long;
        }
    }
    if (snprintf(out, n, "%s%s", sock, VG_LIFECYCLE_SUFFIX) >= (int)n)
        goto too_long;
    return 0;
too_long:
    snprintf(err, errsz, "vgpu: failed to find vgpud's lifecycle socket: the path under %.200s "
             "is too long", sock);
    return -1;
}
