"""The files that hold a node's secrets (the swarm secret, the API token): a node warns once
at start about one that users other than its owner may open, as ssh does about a private
key. Anyone who reads the swarm secret can speak for any node; anyone who reads the token
can use the API. `swarm keygen` writes its file with mode 0600."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from swarm.config import Config

log = logging.getLogger(__name__)

_GROUP_OR_OTHERS = 0o077


def open_to_others(mode: int) -> bool:
    """Whether a file of `mode` (st_mode) lets its group or others read, write or run it.
    Write counts too: whoever can replace the secret can lock nodes out or let a stranger in."""
    return bool(stat.S_IMODE(mode) & _GROUP_OR_OTHERS)


def warn_open_secret_files(config: Config) -> None:
    """Warn about each secret file of `config` that is open to others (a missing one is the
    reader's error, said where it is read)."""
    for setting, path in (
        ("node.secret_file", config.node.secret_file),
        ("api.token_file", config.api.token_file),
    ):
        if path is not None:
            _warn_if_open(setting, path)


def _warn_if_open(setting: str, path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if open_to_others(mode):
        log.warning(
            "%s %s is open to users other than its owner (mode %04o): run chmod 600 %s",
            setting,
            path,
            stat.S_IMODE(mode),
            path,
        )
