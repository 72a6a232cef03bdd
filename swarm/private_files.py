"""The files that hold a node's secrets (the swarm secret, the API token): a node warns once
at start about one that users other than its owner may open, as ssh does about a private
key. Anyone who reads the swarm secret can speak for any node; anyone who reads the token
can use the API. `swarm keygen` writes its file with mode 0600, and so does a node started
with an invite line (`write_private`)."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from swarm.config import Config
from swarm.errors import ConfigError

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


def write_private(path: Path, text: str, what: str) -> None:
    """Keep `text` (a `what`, for the messages) in `path`, readable and writable by its owner
    only from the moment it exists. A file that holds `text` already is left as it is, its
    mode made 0600; one that holds anything else is refused (ConfigError), never replaced."""
    try:
        if path.exists():
            if path.read_text(errors="replace") != text:
                raise ConfigError(
                    f"{path} holds another {what}: move it away, or name another file"
                )
            path.chmod(0o600)
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(partial, path)
    except OSError as e:
        raise ConfigError(f"cannot keep the {what} in {path}: {e.strerror or e}") from None
