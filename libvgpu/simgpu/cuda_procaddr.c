/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_procaddr.c - cuGetProcAddress(_v2): how the CUDA runtime and
 * cuda-python find every other entry point. The name/version table lives in
 * cuda_procs.c; this file only checks arguments and reports the result. It
 * works before cuInit, since the runtime resolves cuInit itself through it.
 */
#include "cuda_internal.h"
#include "cuda_procs.h"

static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *symbolStatus)
{
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn || cudaVersion <= 0 ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int st = simgpu_proc_lookup(symbol, cudaVersion, flags, pfn);
    if (st != CU_GET_PROC_ADDRESS_SUCCESS)
        *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = st;
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIMGPU_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

SIMGPU_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}
