# SPDX-License-Identifier: Apache-2.0
"""The `vgpu` command: list, inspect, change and release vgpud's slices, run a process
in one, and register vgpu with the container engines.

Modules, one job each: `main` (the entry point), `args` (the command line), `render`
(tables and JSON, pure), `client` (vgpud's gRPC API), `paths` (which socket and config),
`commands` (the commands that ask vgpud), `run` and `supervisor` (`vgpu run` and its child).
"""
