/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_module.c - modules and kernel functions.
 *
 * Any image loads (simgpu runs no code). A function named busy_<N>us occupies
 * its device's engine for N microseconds per launch; any other name is a 1 us
 * kernel, so real applications' launches still cost engine time.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"

struct sg_module {
    uint32_t magic;
    pthread_mutex_t lock; /* guards funcs */
    struct sg_func *funcs;
};

/* busy_<N>us -> N us; anything else 1 us. */
static uint64_t kernel_duration_ns(const char *name)
{
    const char *p = name;
    if (strncmp(p, "busy_", 5) == 0) {
        p += 5;
        char *end;
        errno = 0;
        unsigned long long us = strtoull(p, &end, 10);
        if (end != p && strcmp(end, "us") == 0 && errno == 0 && us <= UINT64_MAX / 1000)
            return (uint64_t)us * 1000ull;
    }
    return 1000ull;
}

static CUresult module_new(CUmodule *out)
{
    struct sg_ctx *c;
    CUresult rc = sg_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_module *m = calloc(1, sizeof(*m));
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = SG_MAGIC_MODULE;
    pthread_mutex_init(&m->lock, NULL);
    if (sg_handle_add(m) != 0) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUmodule)m;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module || !image)
        return sg_check_init() != CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    return module_new(module);
}

SIMGPU_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                                       void **optionValues)
{
    (void)numOptions; /* JIT options: nothing is compiled */
    (void)options;
    (void)optionValues;
    return cuModuleLoadData(module, image);
}

SIMGPU_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return cuModuleLoadData(module, fatCubin);
}

SIMGPU_API CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char b;
    ssize_t n = read(fd, &b, 1); /* a directory or unreadable file is not a module */
    close(fd);
    if (n < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    if (n == 0)
        return CUDA_ERROR_INVALID_IMAGE;
    return module_new(module);
}

SIMGPU_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct sg_module *m = (struct sg_module *)hmod;
    if (!m || !sg_handle_ok(m, SG_MAGIC_MODULE))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&m->lock);
    struct sg_func *f;
    for (f = m->funcs; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            break;
    if (!f) {
        size_t len = strlen(name);
        f = calloc(1, sizeof(*f) + len + 1);
        if (f) {
            f->magic = SG_MAGIC_FUNC;
            f->mod = m;
            f->dur_ns = kernel_duration_ns(name);
            memcpy(f->name, name, len + 1);
            if (sg_handle_add(f) != 0) {
                free(f);
                f = NULL;
            } else {
                f->next = m->funcs;
                m->funcs = f;
            }
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sg_module *m = (struct sg_module *)hmod;
    if (!m || !sg_handle_take(m, SG_MAGIC_MODULE))
        return CUDA_ERROR_INVALID_HANDLE;
    for (struct sg_func *f = m->funcs, *next; f; f = next) {
        next = f->next;
        sg_handle_del(f);
        f->magic = SG_MAGIC_DEAD;
        free(f);
    }
    m->magic = SG_MAGIC_DEAD;
    pthread_mutex_destroy(&m->lock);
    free(m);
    return CUDA_SUCCESS;
}

/* CU_MODULE_EAGER_LOADING / CU_MODULE_LAZY_LOADING (CUmoduleLoadingMode). */
enum { SG_MODULE_EAGER_LOADING = 1, SG_MODULE_LAZY_LOADING = 2 };

/* What CUDA_MODULE_LOADING asks for: EAGER, else lazy (the driver's default since
 * CUDA 12.2). NVIDIA's CUDA runtime asks at initialisation, after cuInit, and gives
 * up (cudaErrorNotSupported) when the driver cannot answer. */
SIMGPU_API CUresult cuModuleGetLoadingMode(int *mode)
{
    CUresult rc = sg_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    const char *v = getenv("CUDA_MODULE_LOADING");
    *mode = v && strcmp(v, "EAGER") == 0 ? SG_MODULE_EAGER_LOADING : SG_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}
