# SPDX-License-Identifier: Apache-2.0
"""The kubelet APIs vgpu_k8s speaks, compiled from their .proto files (make proto)."""
