/* SPDX-License-Identifier: Apache-2.0 */
/*
 * procaddr_client - asks the driver's cuGetProcAddress_v2 for one entry point.
 *
 *   procaddr_client SYMBOL VERSION FLAGS [call]
 *
 * prints one JSON line:
 *   {"result": <CUresult>, "status": <CUdriverProcAddressQueryResult>,
 *    "same_as": "<exported symbol at the returned address>" | null}
 * same_as is the name dladdr() gives for the returned pointer, kept only if
 * dlsym() of that name in libcuda.so.1 yields the very same address.
 *
 * With "call", the returned function is also called with no arguments and
 * "call_result" is added. Only do that for entry points that are stubs in
 * simgpu (they take no parameters and return CUDA_ERROR_NOT_SUPPORTED);
 * calling a real entry point without its arguments is undefined.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_cuda.h"

static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "call") != 0)) {
        fprintf(stderr, "usage: %s SYMBOL VERSION FLAGS [call]\n", argv[0]);
        return 2;
    }
    const char *symbol = argv[1];
    int version = (int)strtol(argv[2], NULL, 0);
    cuuint64_t flags = strtoull(argv[3], NULL, 0);

    void *pfn = (void *)0x1; /* must be overwritten (NULL on failure) */
    CUdriverProcAddressQueryResult status = -1;
    CUresult rc = cuGetProcAddress_v2(symbol, &pfn, version, flags, &status);

    const char *same_as = NULL;
    if (pfn && pfn != (void *)0x1) {
        Dl_info info;
        void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (lib && dladdr(pfn, &info) && info.dli_sname && dlsym(lib, info.dli_sname) == pfn)
            same_as = info.dli_sname;
    }

    printf("{\"result\": %d, \"status\": %d, \"pfn_set\": %s, \"same_as\": ", rc, status,
           pfn == (void *)0x1 ? "false" : "true");
    if (same_as)
        print_json_string(same_as);
    else
        fputs("null", stdout);
    if (argc == 5 && pfn && pfn != (void *)0x1) {
        CUresult (*stub)(void) = (CUresult (*)(void))pfn;
        printf(", \"call_result\": %d", stub());
    }
    puts("}");
    return 0;
}
