"""A shard's kept prompt blocks across a restart: written to the node's state folder as it
stops, read back when it serves the same span again (`swarm.runtime.prefix_file`). Both run
on the compute thread, which owns the shard's caches. Neither ever stops a node: a file that
cannot be written loses the blocks, one that cannot be read is deleted."""

from __future__ import annotations

import logging
from pathlib import Path

from swarm import __version__
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.prefix_file import BlocksIdentity, PrefixFileError, load, save

log = logging.getLogger(__name__)


def folder_of(state_dir: Path, node_id: str) -> Path:
    """Where a node keeps its prompt blocks and what it sent through each hop: a folder of
    its own (nodes of one machine may share a state folder)."""
    return state_dir.expanduser() / "prompt-blocks" / node_id


def identity(context: ModelContext, shard: Shard) -> BlocksIdentity:
    shape = shard.kv.shape
    return BlocksIdentity(
        model_id=context.store.manifest.model_id,
        span=(shard.span.start, shard.span.end),
        dtype=str(shape.dtype).removeprefix("torch."),
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        swarm_version=__version__,
    )


def write_kept(context: ModelContext, shard: Shard, folder: Path, limit_bytes: int) -> int:
    """Write the shard's kept blocks, the most recently used first, up to `limit_bytes`;
    how many were written (0 where the disk refused: the blocks are lost, nothing else)."""
    blocks = shard.kv.prefixes.recent_first()
    if not blocks or limit_bytes <= 0:
        return 0
    kept = identity(context, shard)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = save(folder / kept.file_name(), kept, blocks, limit_bytes)
    except OSError as e:
        log.warning("could not keep the prompt cache of layers %s on disk: %s", shard.span, e)
        return 0
    log.info("kept %d prompt blocks of layers %s on disk", written, shard.span)
    return written


def read_kept(context: ModelContext, shard: Shard, folder: Path) -> int:
    """Read back what `write_kept` wrote for the shard's span; how many blocks it now keeps.
    A file made for something else, or torn, is deleted with one warning."""
    kept = identity(context, shard)
    path = folder / kept.file_name()
    if not path.exists():
        return 0
    try:
        blocks = load(path, kept, shard.kv.shape.dtype)
    except (PrefixFileError, OSError) as e:
        log.warning("not reading the prompt cache in %s: %s; deleting it", path, e)
        path.unlink(missing_ok=True)
        return 0
    restored = shard.kv.restore_prefixes(blocks)
    log.info("read %d kept prompt blocks of layers %s back", restored, shard.span)
    return restored
