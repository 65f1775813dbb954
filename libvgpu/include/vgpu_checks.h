/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_checks.h - how a reader applies a file format's checks.
 *
 * Each format's header names, once, the fields a reader checks before it trusts a
 * file and the value each must hold (VGPU_REGION_CHECKS and VGPU_USAGE_CHECKS in
 * vgpu_region.h, VGPU_SCHED_CHECKS and VGPU_SCHED_REQ_CHECKS in vgpu_sched.h). Every
 * reader in C goes through the function VG_DEFINE_CHECK makes from that list, and
 * every creator writes those fields with the one VG_DEFINE_INIT makes; vgpud's
 * Python keeps the same list as data (arbiter/files/header_checks.py), and
 * tests/arbiter/files/test_header_checks.py holds it to this one.
 */
#ifndef VGPU_CHECKS_H
#define VGPU_CHECKS_H

#include <stdint.h>

#define VG_CHECK_FIELD_(field, value)                                                  \
    if ((uint64_t)h_->field != (uint64_t)(value)) {                                    \
        *got_ = (uint64_t)h_->field;                                                   \
        *want_ = (uint64_t)(value);                                                    \
        return #field;                                                                 \
    }

/* static const char *name(const type *h, uint64_t *got, uint64_t *want): the first
 * field of h that does not hold its value (its name; *got and *want say the two
 * values), or NULL when every one does. Reading `h` is the caller's affair (a copy,
 * or a mapping only the file's owner writes). */
#define VG_DEFINE_CHECK(name, type, CHECKS)                                            \
    static inline const char *name(const type *h_, uint64_t *got_, uint64_t *want_)   \
    {                                                                                  \
        CHECKS(VG_CHECK_FIELD_)                                                        \
        (void)h_;                                                                      \
        (void)got_;                                                                    \
        (void)want_;                                                                   \
        return 0;                                                                      \
    }

#define VG_INIT_FIELD_(field, value) h_->field = (value);

/* static void name(type *h): write every field of a *_FIELDS list (all the checked
 * fields but magic, which the creator stores last, once the rest is written). */
#define VG_DEFINE_INIT(name, type, FIELDS)                                             \
    static inline void name(type *h_) { FIELDS(VG_INIT_FIELD_) }

#endif
