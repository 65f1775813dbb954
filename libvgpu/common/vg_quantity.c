/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_quantity.h"

#include <string.h>

int vg_parse_quantity(const char *s, uint64_t *bytes)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {
        {"", 1ull << 20},   {"Ki", 1ull << 10}, {"Mi", 1ull << 20}, {"Gi", 1ull << 30},
        {"Ti", 1ull << 40}, {"K", 1000ull},     {"M", 1000000ull},  {"G", 1000000000ull},
        {"T", 1000000000000ull},
    };
    if (!s)
        return -1;
    uint64_t n = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > (UINT64_MAX - 9) / 10)
            return -1;
        n = n * 10 + (uint64_t)(*p - '0');
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(p, units[i].suffix) == 0) {
            if (n == 0 || n > UINT64_MAX / units[i].mult)
                return -1;
            *bytes = n * units[i].mult;
            return 0;
        }
    }
    return -1;
}
