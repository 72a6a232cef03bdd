"""A part file being assembled from chunks, kept across interruptions."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from swarm.runtime.checkpoint.manifest import PartDigest


class Partial:
    """A part file being assembled: `.<file>.partial`, and beside it the digest and the
    chunks already written and checked, so a later fetch of the same part goes on from there."""

    def __init__(self, base: Path, digest: PartDigest) -> None:
        self.path = base.with_name(base.name + ".partial")
        self._state = base.with_name(base.name + ".partial.json")
        self.digest = digest
        self._done: set[int] = set()
        self._writing = threading.Lock()  # chunks of several peers land on worker threads

    def open(self) -> set[int]:
        """The chunks already in place (none if the partial file is for other bytes)."""
        try:
            state = json.loads(self._state.read_text())
            if state["sha256"] == self.digest.sha256 and self.path.is_file():
                self._done = {int(i) for i in state["done"]}
        except (OSError, ValueError, KeyError, TypeError):
            self._done = set()
        if not self._done:
            with self.path.open("wb") as f:
                f.truncate(self.digest.size)
        return set(self._done)

    def fits(self, index: int, data: bytes) -> bool:
        start, end = self.digest.chunk_range(index)
        return (
            len(data) == end - start
            and hashlib.sha256(data).hexdigest() == (self.digest.chunks[index])
        )

    def write(self, index: int, data: bytes) -> None:
        start, _ = self.digest.chunk_range(index)
        with self._writing:
            with self.path.open("r+b") as f:
                f.seek(start)
                f.write(data)
            self._done.add(index)
            tmp = self._state.with_name(self._state.name + ".tmp")
            tmp.write_text(json.dumps({"sha256": self.digest.sha256, "done": sorted(self._done)}))
            tmp.rename(self._state)

    def complete(self) -> bool:
        return PartDigest.of(self.path.read_bytes()) == self.digest

    def discard(self) -> None:
        with self._writing:  # after a write still running on a worker thread, not amid it
            self.path.unlink(missing_ok=True)
            self.forget()

    def forget(self) -> None:
        self._state.unlink(missing_ok=True)
        self._state.with_name(self._state.name + ".tmp").unlink(missing_ok=True)
