# SPDX-License-Identifier: Apache-2.0
"""`python -m vgpud`: the same as the `vgpud` command."""
import sys

from vgpud.main import main

sys.exit(main())
