/* SPDX-License-Identifier: Apache-2.0 */
/* The client side of vgpud's lifecycle socket (arbiter/lifecycle.py has the protocol):
 * a 4-byte big-endian length, then `key=value` fields each ended by a NUL byte. */
#ifndef VG_MSG_H
#define VG_MSG_H

#include <stddef.h>

#define VG_PROTOCOL_VERSION "1"
#define VG_MSG_MAX (1u << 20)

struct vg_msg {
    char *data;     /* the fields, back to back */
    size_t len;
    size_t cap;
};

/* vg_call's results besides 0 (answered). */
enum { VG_CALL_UNREACHABLE = -2, VG_CALL_FAILED = -1 };

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
 * `timeout_ms`. VG_CALL_UNREACHABLE: nobody listens there (the caller falls back to
 * Python); VG_CALL_FAILED: `err` says why. */
int vg_call(const char *path, const struct vg_msg *req, struct vg_msg *reply, int timeout_ms,
            char *err, size_t errsz);

#endif
