# SPDX-License-Identifier: Apache-2.0
"""Helpers the test packages share: paths of the built artefacts, processes, engines,
images, GPU loads and a vgpud harness. Imported as `support.<module>` (pytest puts
tests/ on sys.path: pyproject's pythonpath)."""
