# SPDX-License-Identifier: Apache-2.0
"""Which vgpud socket and config file a command uses, and the paths a config file names.

arbiter.config is imported only when a config file is read: loading it (YAML, the
JSON Schema) costs more than the whole of `vgpu --help`.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arbiter import defaults
from arbiter.errors import VgpuError
from vgpu_cli.errors import CliError

__all__ = ["DEFAULT_CONFIG", "DEFAULT_SOCKET", "config_paths", "resolve_config",
           "resolve_socket"]

DEFAULT_SOCKET = str(defaults.DEFAULT_SOCKET)
DEFAULT_CONFIG = str(defaults.DEFAULT_CONFIG_PATH)


def resolve_socket(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """--socket, else $VGPU_SOCKET, else the config file's socket, else the default path."""
    if args.socket:
        return str(args.socket)
    if env.get(defaults.ENV_SOCKET):
        return env[defaults.ENV_SOCKET]
    config = resolve_config(args, env)
    if Path(config).is_file():  # only then: loading the schema costs time
        paths = config_paths(config)
        if "config_error" in paths:
            raise CliError(paths["config_error"])
        if paths.get("config_socket"):
            return str(paths["config_socket"])
    return DEFAULT_SOCKET


def resolve_config(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """--config, else $VGPU_CONFIG, else the default path."""
    return str(args.config or env.get(defaults.ENV_CONFIG) or DEFAULT_CONFIG)


def config_paths(config: str) -> dict[str, Any]:
    """Paths the config file (or the defaults) names; `config_error` when it cannot be read."""
    from arbiter.config import load_config

    try:
        cfg = load_config(Path(config))
    except VgpuError as e:
        return {"config_error": str(e)}
    except OSError as e:
        return {"config_error": f"failed to load config {config}: {e.strerror or e}"}
    result: dict[str, Any] = {}
    for key in ("socket", "state_dir", "run_dir", "event_log", "metrics_address"):
        value = getattr(cfg, key)
        result["config_socket" if key == "socket" else key] = (
            str(value) if value is not None else None)
    return result
