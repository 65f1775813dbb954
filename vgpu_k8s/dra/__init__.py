# SPDX-License-Identifier: Apache-2.0
"""vgpu-dra-plugin: the kubelet's DRA plugin for driver `vgpu.io`. It publishes one
ResourceSlice device per GPU with consumable `memory` and `compute` capacities, turns each
allocated ResourceClaim into one vgpud slice and a CDI spec, and keeps a checkpoint of
what it prepared."""

__all__: list[str] = []
