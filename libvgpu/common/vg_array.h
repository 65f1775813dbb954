/* SPDX-License-Identifier: Apache-2.0 */
/* vg_array.h - the device memory a CUDA array holds; one definition for simgpu and libvgpu. */
#ifndef VG_ARRAY_H
#define VG_ARRAY_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a w x h x d array (0 extents count as 1) of `channels` elements of
 * CUarray_format `format`, with `levels` mipmap levels (1 = a plain array;
 * each level halves every extent down to 1). 0 when the format, channel count
 * or level count is invalid; UINT64_MAX when it overflows. */
uint64_t vg_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned levels);

#endif
