# SPDX-License-Identifier: Apache-2.0
"""`python -m oci_hook PHASE`: the same as the `vgpu-hook` script."""
import sys

from oci_hook.main import main

sys.exit(main())
