/* SPDX-License-Identifier: Apache-2.0 */
/* The client side of vgpud's lifecycle socket (shim/lifecycle.py has the server): one
 * request, one reply per connection, each a 4-byte big-endian length, then `key=value`
 * fields each ended by a NUL byte. Every request and reply carries v=VG_PROTOCOL_VERSION. */
#ifndef VG_MSG_H
#define VG_MSG_H

#include <stddef.h>

#include "vg_defaults.h"

#define VG_MSG_MAX (1u << 20)
#define VG_RETRY_MS 25          /* between connects while vgpud is away (restarting) */

struct vg_msg {
    char *data;     /* the fields, back to back */
    size_t len;
    size_t cap;
};

/* vg_call's results besides 0 (answered in our protocol version). */
enum { VG_CALL_VERSION = -3, VG_CALL_UNREACHABLE = -2, VG_CALL_FAILED = -1 };

/* Start a request: v=<our version>, op=<op>; -1 on ENOMEM. */
int vg_msg_start(struct vg_msg *m, const char *op);

/* Append `key=value` (value of `vlen` bytes, no NUL inside); -1 on a bad field or ENOMEM. */
int vg_msg_addn(struct vg_msg *m, const char *key, const char *value, size_t vlen);
int vg_msg_add(struct vg_msg *m, const char *key, const char *value);
void vg_msg_free(struct vg_msg *m);

/* The first value of `key`, or NULL. */
const char *vg_msg_get(const struct vg_msg *m, const char *key);

/* Iterate: *pos starts at 0; sets the key (not NUL-terminated: *klen) and the value. */
int vg_msg_next(const struct vg_msg *m, size_t *pos, const char **key, size_t *klen,
                const char **value);

/* Send `req` to the unix socket `path` and read the answer into `reply`, all within
 * `timeout_ms`; while the socket is missing or refuses (vgpud restarting) connect is
 * retried every VG_RETRY_MS. On failure `err` is the line's cause:
 * VG_CALL_UNREACHABLE: no vgpud answered within the time;
 * VG_CALL_VERSION: the reply is of another protocol version (`client` names us);
 * VG_CALL_FAILED: anything else. */
int vg_call(const char *path, const char *client, const struct vg_msg *req,
            struct vg_msg *reply, int timeout_ms, char *err, size_t errsz);

/* The line for a reply that is not what the caller can go on with: vgpud's message
 * for status=error, else the status named (`op` was asked, to `doing`). */
void vg_reply_line(const struct vg_msg *reply, const char *sock, const char *op,
                   const char *doing, char *out, size_t n);

#endif
