# SPDX-License-Identifier: Apache-2.0
"""Slices: placement, the durable store, and who holds each slice."""
