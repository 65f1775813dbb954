# SPDX-License-Identifier: Apache-2.0
"""`python -m shim ...`: vgpu-runtime."""
import sys

from shim.runtime import main

sys.exit(main())
