# SPDX-License-Identifier: Apache-2.0
"""The domain of one host's GPU sharing, and vgpud, the daemon that serves it.

- files/: the files a slice is made of (region, usage and scheduling files, its tmpfs);
- slices/: placement, the durable store, identity: which slices exist and who holds them;
- compute/: enforcement from the host (the token broker's supervisor, the guards);
- daemon/: vgpud, which puts them together behind its gRPC API;
- install/: versioned installs of the native parts, and the files vgpu ships;
- the modules here (errors, model, config, quantity, ...) are shared by all of them, and
  by the packages built on arbiter (the hook, the shim, the CLI, the Kubernetes agents).
"""

__all__: list[str] = []
