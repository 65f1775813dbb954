/* SPDX-License-Identifier: Apache-2.0 */
#include "vg_array.h"

#include "../include/vgpu_cuda.h"

static unsigned format_bytes(int f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

uint64_t vg_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned levels)
{
    unsigned fb = format_bytes(format);
    if (w == 0 || fb == 0 || (channels != 1 && channels != 2 && channels != 4) || levels == 0)
        return 0;
    h = h ? h : 1;
    d = d ? d : 1;
    unsigned __int128 total = 0;
    for (unsigned l = 0; l < levels; l++) {
        total += (unsigned __int128)w * h * d * channels * fb;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        d = d > 1 ? d / 2 : 1;
    }
    return total >> 63 ? UINT64_MAX : (uint64_t)total;
}
