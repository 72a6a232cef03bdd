"""Who this node is: a stable id kept on disk per port."""

from __future__ import annotations

import uuid
from pathlib import Path

from swarm.errors import CacheWriteError
from swarm.types import NodeId


def ran_before(state_dir: Path, port: int) -> bool:
    """Whether a node on this port kept an id from an earlier run (asked before `node_id`
    makes one): frames sealed for that run may still be on their way, and a restarted node
    refuses what the earlier run may have taken. Frames for an id never used cannot exist."""
    return port != 0 and _id_file(state_dir, port).is_file()


def node_id(state_dir: Path, port: int) -> NodeId:
    """Stable per machine and port, kept on disk, so a restarted node keeps its identity.
    A node on an ephemeral port (0) gets a fresh id each run."""
    if port == 0:
        return NodeId(uuid.uuid4().hex[:12])
    path = _id_file(state_dir, port)
    try:
        if path.is_file():
            return NodeId(path.read_text().strip())
        path.parent.mkdir(parents=True, exist_ok=True)
        new_id = uuid.uuid4().hex[:12]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(new_id)
        tmp.rename(path)
        return NodeId(new_id)
    except OSError as e:
        raise CacheWriteError(f"cannot keep the node id in {path.parent}: {e.strerror}") from None


def _id_file(state_dir: Path, port: int) -> Path:
    return state_dir.expanduser() / f"node-{port}.id"
