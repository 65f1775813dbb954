/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dlsym_next - checks that dlsym(RTLD_NEXT, ...) keeps glibc's meaning ("the
 * next definition after the caller's object") when libvgpu interposes dlsym.
 * Prints JSON: for each name, whether RTLD_NEXT from this executable found the
 * same definition as RTLD_DEFAULT (it must: the executable defines neither).
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    printf("{");
    for (int i = 1; i < argc; i++) {
        void *next = dlsym(RTLD_NEXT, argv[i]);
        void *dflt = dlsym(RTLD_DEFAULT, argv[i]);
        Dl_info info = {0};
        if (next)
            dladdr(next, &info);
        printf("%s\"%s\":{\"same\":%s,\"found\":%s,\"object\":\"%s\"}", i > 1 ? "," : "", argv[i],
               next == dflt ? "true" : "false", next ? "true" : "false", info.dli_fname ? info.dli_fname : "");
    }
    printf("}\n");
    return 0;
}
