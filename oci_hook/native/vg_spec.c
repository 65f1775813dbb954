/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deeper nesting is called malformed (no spec nests near this); bounds the recursion. */
#define MAX_DEPTH 256
#define SPEC_MAX (64u << 20)
#define KEY_MAX 64      /* the decoded bytes of a key kept: enough for every name we test */

/* What a value is, as far as the request test cares. */
enum role {
    R_OTHER,
    R_TOP,          /* the document: its keys below */
    R_ANNOTATIONS,  /* top-level "annotations": its keys may ask */
    R_PROCESS,      /* top-level "process" */
    R_ENV,          /* process.env */
    R_ENV_ITEM,     /* one string of process.env: may ask */
    R_BUNDLE,       /* top-level "bundle" (OCI state) */
    R_STATUS,       /* top-level "status" (OCI state) */
    R_ID,           /* top-level "id" (OCI state) */
    R_CRI_TYPE,     /* annotations[VG_CRI_TYPE_KEY] */
    R_CRIO_TYPE,    /* annotations[VG_CRIO_TYPE_KEY] */
};

struct walk {
    const char *p, *end;
    struct vg_spec *out;
    /* Per type key (R_CRI_TYPE, R_CRIO_TYPE): its last value is VG_SANDBOX_TYPE. */
    int sandbox[2];
};

static int value(struct walk *w, int depth, enum role role);

static void skip_ws(struct walk *w)
{
    while (w->p < w->end && (*w->p == ' ' || *w->p == '\t' || *w->p == '\n' || *w->p == '\r'))
        w->p++;
}

static int eat(struct walk *w, char c)
{
    skip_ws(w);
    if (w->p < w->end && *w->p == c) {
        w->p++;
        return 1;
    }
    return 0;
}

/* Decoded bytes go to buf[0..cap) as far as they fit; *total counts them all. */
static void put(char *buf, size_t cap, size_t *total, unsigned char c)
{
    if (*total < cap)
        buf[*total] = (char)c;
    (*total)++;
}

static void put_utf8(char *buf, size_t cap, size_t *total, unsigned long cp)
{
    if (cp < 0x80) {
        put(buf, cap, total, (unsigned char)cp);
    } else if (cp < 0x800) {
        put(buf, cap, total, (unsigned char)(0xC0 | cp >> 6));
        put(buf, cap, total, (unsigned char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        put(buf, cap, total, (unsigned char)(0xE0 | cp >> 12));
        put(buf, cap, total, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
        put(buf, cap, total, (unsigned char)(0x80 | (cp & 0x3F)));
    } else {
        put(buf, cap, total, (unsigned char)(0xF0 | cp >> 18));
        put(buf, cap, total, (unsigned char)(0x80 | (cp >> 12 & 0x3F)));
        put(buf, cap, total, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
        put(buf, cap, total, (unsigned char)(0x80 | (cp & 0x3F)));
    }
}

/* Four hex digits at p into *cp; 0 if they are not. */
static int hex4(const char *p, const char *end, unsigned long *cp)
{
    if (end - p < 4)
        return 0;
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        *cp = *cp << 4 | (unsigned long)d;
    }
    return 1;
}

/* A JSON string at w->p (the opening quote), decoded as Python's json does. */
static int string(struct walk *w, char *buf, size_t cap, size_t *total)
{
    *total = 0;
    if (w->p >= w->end || *w->p != '"')
        return 0;
    w->p++;
    while (w->p < w->end) {
        unsigned char c = (unsigned char)*w->p++;
        if (c == '"')
            return 1;
        if (c < 0x20)
            return 0;             /* a raw control character: strict JSON refuses it */
        if (c != '\\') {
            put(buf, cap, total, c);
            continue;
        }
        if (w->p >= w->end)
            return 0;
        char e = *w->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e != '\0' && simple != NULL) {
            put(buf, cap, total, (unsigned char)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]);
            continue;
        }
        unsigned long cp, low;
        if (e != 'u' || !hex4(w->p, w->end, &cp))
            return 0;
        w->p += 4;
        /* A surrogate pair is one character; a lone surrogate stays itself (as in Python). */
        if (cp >= 0xD800 && cp <= 0xDBFF && w->end - w->p >= 6 && w->p[0] == '\\' &&
            w->p[1] == 'u' && hex4(w->p + 2, w->end, &low) && low >= 0xDC00 && low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            w->p += 6;
        }
        put_utf8(buf, cap, total, cp);
    }
    return 0;
}

static int starts(const char *buf, size_t total, size_t cap, const char *prefix)
{
    size_t n = strlen(prefix);
    return total >= n && n <= cap && memcmp(buf, prefix, n) == 0;
}

static int is(const char *buf, size_t total, const char *word)
{
    return total == strlen(word) && memcmp(buf, word, total) == 0;
}

/* A string value: the env item and the state's fields read it. */
static int string_value(struct walk *w, enum role role)
{
    char small[KEY_MAX];
    size_t total;
    char *dst = role == R_BUNDLE ? w->out->bundle : role == R_STATUS ? w->out->status
              : role == R_ID ? w->out->id : NULL;
    if (dst != NULL) {
        size_t cap = role == R_BUNDLE ? sizeof(w->out->bundle) : role == R_STATUS
                   ? sizeof(w->out->status) : sizeof(w->out->id);
        if (!string(w, dst, cap - 1, &total))
            return 0;
        /* Too long, or a NUL inside: no usable value. */
        dst[total < cap && memchr(dst, '\0', total) == NULL ? total : 0] = '\0';
        return 1;
    }
    if (!string(w, small, sizeof(small), &total))
        return 0;
    if (role == R_CRI_TYPE || role == R_CRIO_TYPE)
        w->sandbox[role - R_CRI_TYPE] = is(small, total, VG_SANDBOX_TYPE);
    if (role == R_ENV_ITEM && starts(small, total, sizeof(small), VG_ENV_PREFIX))
        w->out->asks = 1;
    return 1;
}

static enum role member_role(enum role parent, const char *key, size_t klen)
{
    if (parent == R_TOP) {
        if (is(key, klen, "annotations"))
            return R_ANNOTATIONS;
        if (is(key, klen, "process"))
            return R_PROCESS;
        if (is(key, klen, "bundle"))
            return R_BUNDLE;
        if (is(key, klen, "status"))
            return R_STATUS;
        if (is(key, klen, "id"))
            return R_ID;
    }
    if (parent == R_PROCESS && is(key, klen, "env"))
        return R_ENV;
    if (parent == R_ANNOTATIONS && is(key, klen, VG_CRI_TYPE_KEY))
        return R_CRI_TYPE;
    if (parent == R_ANNOTATIONS && is(key, klen, VG_CRIO_TYPE_KEY))
        return R_CRIO_TYPE;
    return R_OTHER;
}

static int object(struct walk *w, int depth, enum role role)
{
    w->p++;                       /* '{' */
    if (role == R_ANNOTATIONS)    /* a repeated "annotations" replaces the one before */
        w->sandbox[0] = w->sandbox[1] = 0;
    if (eat(w, '}'))
        return 1;
    do {
        char key[KEY_MAX];
        size_t klen;
        skip_ws(w);
        if (!string(w, key, sizeof(key), &klen) || !eat(w, ':'))
            return 0;
        if (role == R_ANNOTATIONS && (starts(key, klen, sizeof(key), VG_ANNOTATION_PREFIX) ||
                                      starts(key, klen, sizeof(key), VG_CDI_ANNOTATION_PREFIX)))
            w->out->asks = 1;
        enum role member = member_role(role, key, klen);
        if (member == R_CRI_TYPE || member == R_CRIO_TYPE)
            w->sandbox[member - R_CRI_TYPE] = 0;   /* a value that is no string is no sandbox */
        if (!value(w, depth + 1, member))
            return 0;
    } while (eat(w, ','));
    return eat(w, '}');
}

static int array(struct walk *w, int depth, enum role role)
{
    w->p++;                       /* '[' */
    if (eat(w, ']'))
        return 1;
    do {
        if (!value(w, depth + 1, role == R_ENV ? R_ENV_ITEM : R_OTHER))
            return 0;
    } while (eat(w, ','));
    return eat(w, ']');
}

static int digits(struct walk *w)
{
    const char *start = w->p;
    while (w->p < w->end && *w->p >= '0' && *w->p <= '9')
        w->p++;
    return w->p > start;
}

/* The grammar of Python's json: -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? */
static int number(struct walk *w)
{
    if (w->p < w->end && *w->p == '-')
        w->p++;
    if (w->p < w->end && *w->p == '0')
        w->p++;
    else if (!digits(w))
        return 0;
    if (w->p < w->end && *w->p == '.') {
        w->p++;
        if (!digits(w))
            return 0;
    }
    if (w->p < w->end && (*w->p == 'e' || *w->p == 'E')) {
        w->p++;
        if (w->p < w->end && (*w->p == '+' || *w->p == '-'))
            w->p++;
        if (!digits(w))
            return 0;
    }
    return 1;
}

static int literal(struct walk *w)
{
    /* Python's json also takes NaN and the infinities. */
    static const char *const words[] = {"true", "false", "null", "NaN", "Infinity",
                                        "-Infinity", NULL};
    for (const char *const *word = words; *word; word++) {
        size_t n = strlen(*word);
        if ((size_t)(w->end - w->p) >= n && memcmp(w->p, *word, n) == 0) {
            w->p += n;
            return 1;
        }
    }
    return number(w);
}

static int value(struct walk *w, int depth, enum role role)
{
    if (depth > MAX_DEPTH)
        return 0;
    skip_ws(w);
    if (w->p >= w->end)
        return 0;
    switch (*w->p) {
    case '{':
        return object(w, depth, role == R_TOP || role == R_ANNOTATIONS || role == R_PROCESS
                                    ? role : R_OTHER);
    case '[':
        return array(w, depth, role == R_ENV ? R_ENV : R_OTHER);
    case '"':
        return string_value(w, role);
    default:
        return literal(w);
    }
}

void vg_spec_scan(const char *text, size_t len, struct vg_spec *out)
{
    memset(out, 0, sizeof(*out));
    struct walk w = {.p = text, .end = text + len, .out = out};
    int ok = value(&w, 0, R_TOP);
    skip_ws(&w);
    if (ok && w.p == w.end) {
        if (w.sandbox[0] || w.sandbox[1])
            out->asks = 0;        /* a pod's sandbox never gets a slice */
        return;
    }
    /* Not JSON: vgpud could not read a request from it either, but stay on the safe side
     * where the bytes could spell one (directly or through an escape). */
    memset(out, 0, sizeof(*out));
    out->malformed = 1;
    out->asks = memmem(text, len, "vgpu.io", 7) != NULL || memmem(text, len, "VGPU_", 5) != NULL ||
                memmem(text, len, "\\u", 2) != NULL;
}

int vg_spec_scan_bundle(const char *bundle, struct vg_spec *out)
{
    char path[VG_PATH_MAX + 16];
    size_t len;
    if (snprintf(path, sizeof(path), "%s/config.json", bundle) >= (int)sizeof(path))
        return -1;
    char *spec = vg_read_file(path, SPEC_MAX, &len);
    if (spec == NULL)
        return -1;
    vg_spec_scan(spec, len, out);
    free(spec);
    return 0;
}
