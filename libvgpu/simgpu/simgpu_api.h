/* SPDX-License-Identifier: Apache-2.0 */
/* simgpu_api.h - marks the entry points simgpu exports (everything else is hidden). */
#ifndef SIMGPU_API_H
#define SIMGPU_API_H

#define SIMGPU_API __attribute__((visibility("default")))
/* Generated stubs for entry points simgpu does not implement: a real
 * definition elsewhere in the library overrides them at link time. */
#define SIMGPU_STUB __attribute__((visibility("default"), weak))

#endif
