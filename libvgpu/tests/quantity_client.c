/* SPDX-License-Identifier: Apache-2.0 */
/*
 * quantity_client - print what vg_parse_quantity makes of each argument, one
 * line each: the byte count, or "error". `quantity_client --forms` prints
 * VG_QUANTITY_FORMS. tests/arbiter/test_quantity.py runs it against arbiter/quantity.py.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The parser is hidden inside libvgpu.so (-fvisibility=hidden): compile it in. */
#include "../common/vg_quantity.c"

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--forms") == 0) {
        puts(VG_QUANTITY_FORMS);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        uint64_t bytes = 0;
        if (vg_parse_quantity(argv[i], &bytes) == 0)
            printf("%" PRIu64 "\n", bytes);
        else
            puts("error");
    }
    return 0;
}
