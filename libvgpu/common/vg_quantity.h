/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vg_quantity.h - memory quantities, as in DESIGN.md: an integer with an
 * optional suffix; none = MiB; Ki Mi Gi Ti binary; K M G T decimal.
 * arbiter/quantity.py is the Python twin; tests run both over one table.
 */
#ifndef VG_QUANTITY_H
#define VG_QUANTITY_H

#include <stdint.h>

#define VG_QUANTITY_FORMS "an integer with an optional suffix Ki, Mi, Gi, Ti, K, M, G or T (no suffix = MiB)"

/* Parse s into bytes. Returns 0, or -1 when s is malformed, zero or overflows. */
int vg_parse_quantity(const char *s, uint64_t *bytes);

#endif
