"""Where a node finds its config file without being told, and the effective config written
back as TOML (what `swarm config` prints), with secrets hidden."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarm.config import Config

CONFIG_FILE_NAME = "bootstrap.toml"
_SECRET_FIELDS = ("token",)  # api.token; secret files are paths and stay visible


def config_search_path(environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Where a node looks for its config file when none is named, first match wins: the
    working directory, the user's config folder ($XDG_CONFIG_HOME or ~/.config), then
    /etc/swarm."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME")
    user = Path(xdg) if xdg else Path.home() / ".config"
    return (
        Path.cwd() / CONFIG_FILE_NAME,
        user / "swarm" / CONFIG_FILE_NAME,
        Path("/etc/swarm") / CONFIG_FILE_NAME,
    )


def find_config_file(environ: Mapping[str, str] | None = None) -> Path | None:
    return next((p for p in config_search_path(environ) if p.is_file()), None)


def config_as_toml(config: Config) -> str:
    """Every setting in force, as a TOML file that `--config` would accept."""
    lines: list[str] = []
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        values = getattr(config, section.name)
        for item in dataclasses.fields(values):
            value = getattr(values, item.name)
            if item.name in _SECRET_FIELDS and value:
                lines.append(f'{item.name} = "<redacted>"')
            elif value is None:
                lines.append(f"# {item.name} = (not set)")
            else:
                lines.append(f"{item.name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string
