# SPDX-License-Identifier: Apache-2.0
"""`python -m vgpu_cli`: the `vgpu` command."""
import sys

from vgpu_cli.main import main

sys.exit(main())
