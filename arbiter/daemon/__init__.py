# SPDX-License-Identifier: Apache-2.0
"""vgpud: the daemon that composes the arbiter with its gRPC service, the reconciler,
socket activation and the relay, metrics and the event log."""
