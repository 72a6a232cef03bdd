"""The addresses a node has seen alive, kept in its state dir, so that a node that restarts
(one machine, or the whole lab after a power cut) knocks on its old peers again even when
none of them is a bootstrap address (`swarm.membership.rejoin`).

The file is JSON, {"seen": {address: unix time last seen alive}}, written whole to a temporary
file and renamed, so a crash never leaves half of it. A file that cannot be read or does not
fit is one warning and an empty book: healing is an aid, never a reason not to start."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_MAX_ADDRESSES = 4096  # a book bigger than this was not written by a node
_MAX_ADDRESS_CHARS = 300


class AddressBook:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[tuple[str, float]]:
        """(address, unix time last seen alive) pairs; empty when there is no usable file."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            log.warning(
                "cannot read the remembered members in %s (%s); starting without", self.path, e
            )
            return []
        try:
            seen = json.loads(text)["seen"]
            pairs = [(str(a), float(t)) for a, t in seen.items()]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning(
                "ignoring the remembered members in %s: not a members file (%s)", self.path, e
            )
            return []
        if len(pairs) > _MAX_ADDRESSES:
            log.warning(
                "ignoring the remembered members in %s: %d addresses", self.path, len(pairs)
            )
            return []
        return [(a, t) for a, t in pairs if 0 < len(a) <= _MAX_ADDRESS_CHARS and math.isfinite(t)]

    def save(self, seen: Iterable[tuple[str, float]]) -> None:
        """Replace the file with `seen` ((address, unix time) pairs); a failure is logged."""
        data = json.dumps({"seen": dict(seen)}, indent=1, sort_keys=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(data)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot keep the remembered members in %s: %s", self.path, e)
