# SPDX-License-Identifier: Apache-2.0
"""vgpud's composition root: the domain daemon (arbiter) with the container lifecycle socket
(shim) attached. The only package that imports both."""
