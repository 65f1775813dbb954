# SPDX-License-Identifier: Apache-2.0
"""Compute enforcement from the host: the token broker's supervisor and watch,
and the out-of-band guards (compute and memory) with the cgroup freezer."""
