/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_msg.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int reserve(struct vg_msg *m, size_t more)
{
    if (m->len + more <= m->cap)
        return 0;
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < m->len + more)
        cap *= 2;
    char *bigger = realloc(m->data, cap);
    if (bigger == NULL)
        return -1;
    m->data = bigger;
    m->cap = cap;
    return 0;
}

int vg_msg_addn(struct vg_msg *m, const char *key, const char *value, size_t vlen)
{
    size_t klen = strlen(key);
    if (klen == 0 || strchr(key, '=') != NULL || memchr(value, '\0', vlen) != NULL) {
        errno = EINVAL;
        return -1;
    }
    if (reserve(m, klen + vlen + 2) != 0)
        return -1;
    memcpy(m->data + m->len, key, klen);
    m->data[m->len + klen] = '=';
    memcpy(m->data + m->len + klen + 1, value, vlen);
    m->data[m->len + klen + 1 + vlen] = '\0';
    m->len += klen + vlen + 2;
    return 0;
}

int vg_msg_add(struct vg_msg *m, const char *key, const char *value)
{
    return vg_msg_addn(m, key, value ? value : "", value ? strlen(value) : 0);
}

void vg_msg_free(struct vg_msg *m)
{
    free(m->data);
    m->data = NULL;
    m->len = m->cap = 0;
}

int vg_msg_next(const struct vg_msg *m, size_t *pos, const char **key, size_t *klen,
                const char **value)
{
    while (*pos < m->len) {
        const char *field = m->data + *pos;
        size_t flen = strlen(field);   /* the body ends with a NUL: checked on receipt */
        *pos += flen + 1;
        const char *eq = strchr(field, '=');
        if (eq == NULL || eq == field)
            continue;
        *key = field;
        *klen = (size_t)(eq - field);
        *value = eq + 1;
        return 1;
    }
    return 0;
}

const char *vg_msg_get(const struct vg_msg *m, const char *key)
{
    size_t pos = 0, klen, want = strlen(key);
    const char *k, *v;
    while (vg_msg_next(m, &pos, &k, &klen, &v))
        if (klen == want && memcmp(k, key, klen) == 0)
            return v;
    return NULL;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for `events` on fd until the deadline; 0 ready, -1 timed out or failed. */
static int wait_fd(int fd, short events, long long deadline)
{
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)left);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static int send_all(int fd, const char *buf, size_t len, long long deadline)
{
    while (len) {
        if (wait_fd(fd, POLLOUT, deadline) != 0)
            return -1;
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, char *buf, size_t len, long long deadline)
{
    while (len) {
        if (wait_fd(fd, POLLIN, deadline) != 0)
            return -1;
        ssize_t r = recv(fd, buf, len, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = ECONNRESET;
            return -1;
        }
        buf += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Connect to `addr`, retrying while the socket is missing or refuses, until `deadline`.
 * The fd, or -1 with errno (ETIMEDOUT: nobody accepted in time). */
static int connect_until(const struct sockaddr_un *addr, long long deadline)
{
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        /* A blocking connect on a unix socket waits (for a full backlog) up to SO_SNDTIMEO. */
        long long left = deadline - now_ms();
        if (left < 1)
            left = 1;
        struct timeval tv = {.tv_sec = left / 1000, .tv_usec = (left % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0)
            return fd;
        int e = errno;
        close(fd);
        if (e == EINTR)
            continue;
        if (e != ENOENT && e != ECONNREFUSED && e != EAGAIN) {
            errno = e;
            return -1;
        }
        left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct timespec nap = {.tv_nsec = (left < VG_RETRY_MS ? left : VG_RETRY_MS) * 1000000L};
        nanosleep(&nap, NULL);
    }
}

int vg_msg_start(struct vg_msg *m, const char *op)
{
    return vg_msg_add(m, "v", VG_PROTOCOL_VERSION) || vg_msg_add(m, "op", op) ? -1 : 0;
}

int vg_call(const char *path, const char *client, const struct vg_msg *req,
            struct vg_msg *reply, int timeout_ms, char *err, size_t errsz)
{
    long long deadline = now_ms() + timeout_ms;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path)) {
        snprintf(err, errsz, "the socket path %s is too long", path);
        return VG_CALL_FAILED;
    }
    strcpy(addr.sun_path, path);
    int fd = connect_until(&addr, deadline);
    if (fd < 0) {
        if (errno == ETIMEDOUT) {
            snprintf(err, errsz, "vgpud at %s did not answer within %gs (is vgpud running?)",
                     path, timeout_ms / 1000.0);
            return VG_CALL_UNREACHABLE;
        }
        snprintf(err, errsz, "cannot connect to vgpud at %s: %s", path, strerror(errno));
        return VG_CALL_FAILED;
    }
    unsigned char header[4];
    uint32_t len = (uint32_t)req->len;
    header[0] = (unsigned char)(len >> 24);
    header[1] = (unsigned char)(len >> 16);
    header[2] = (unsigned char)(len >> 8);
    header[3] = (unsigned char)len;
    if (send_all(fd, (const char *)header, 4, deadline) != 0 ||
        send_all(fd, req->data, req->len, deadline) != 0 ||
        recv_all(fd, (char *)header, 4, deadline) != 0)
        goto io_fail;
    len = (uint32_t)header[0] << 24 | (uint32_t)header[1] << 16 | (uint32_t)header[2] << 8 |
          header[3];
    if (len > VG_MSG_MAX || (len && reserve(reply, len) != 0)) {
        close(fd);
        snprintf(err, errsz, "vgpud at %s sent a frame of %u bytes", path, len);
        return VG_CALL_FAILED;
    }
    if (recv_all(fd, reply->data, len, deadline) != 0)
        goto io_fail;
    close(fd);
    reply->len = len;
    if (len && reply->data[len - 1] != '\0') {
        snprintf(err, errsz, "vgpud at %s sent a malformed answer", path);
        return VG_CALL_FAILED;
    }
    const char *v = vg_msg_get(reply, "v");
    if (v == NULL || strcmp(v, VG_PROTOCOL_VERSION) != 0) {
        char theirs[24] = "no version";
        if (v != NULL)
            snprintf(theirs, sizeof(theirs), "v%.16s", v);
        snprintf(err, errsz, "%s speaks lifecycle protocol v%s; vgpud at %s speaks %s", client,
                 VG_PROTOCOL_VERSION, path, theirs);
        return VG_CALL_VERSION;
    }
    return 0;
io_fail:;
    int e = errno;
    close(fd);
    if (e == ETIMEDOUT)
        snprintf(err, errsz, "vgpud at %s did not answer within %gs (is vgpud running?)", path,
                 timeout_ms / 1000.0);
    else
        snprintf(err, errsz, "vgpud at %s: %s", path, strerror(e));
    return VG_CALL_FAILED;
}

void vg_reply_line(const struct vg_msg *reply, const char *sock, const char *op,
                   const char *doing, char *out, size_t n)
{
    const char *status = vg_msg_get(reply, "status"), *message = vg_msg_get(reply, "message");
    int error = status && strcmp(status, "error") == 0;
    if (error && message && *message)
        snprintf(out, n, "%s", message);
    else
        snprintf(out, n, "failed to %s: vgpud at %s answered %s with status '%.32s'%s", doing,
                 sock, op, status ? status : "", error ? " and no message" : "");
}
