# SPDX-License-Identifier: Apache-2.0
"""`python -m vgpud`: the same as the `vgpud` command."""
from vgpud.command import run

run()
