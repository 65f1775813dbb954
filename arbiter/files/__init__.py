# SPDX-License-Identifier: Apache-2.0
"""The files a slice is made of: region, usage and scheduling files, the slice's
own tmpfs, and the atomic writes and lease-safe opens they are made with."""
