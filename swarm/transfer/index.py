"""A model's index (manifest, config, tokenizer), asked of a peer and written into the cache."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from swarm.errors import CacheWriteError, ModelNotFoundError, TransferError
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE, Manifest
from swarm.runtime.checkpoint.store import answers_to, fetched_folder
from swarm.transfer.fetch import PeerClient
from swarm.transfer.protocol import MAX_INDEX_BYTES, Ask, Request


def write_index(fields: dict[str, Any], ref: str, cache_dir: Path) -> Path:
    """Check and store an INDEX reply: every file name relative and inside the folder, the
    manifest readable and naming the model asked for. Returns the store's folder."""
    files = fields.get("files")
    if not isinstance(files, dict) or MANIFEST_FILE not in files:
        raise TransferError("a peer's model index without a manifest")
    cache_dir = cache_dir.expanduser()
    tmp = cache_dir / f".index-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        for name, data in files.items():
            rel = PurePosixPath(str(name))
            if rel.is_absolute() or ".." in rel.parts or not isinstance(data, bytes):
                raise TransferError(f"a peer's model index names a bad file {name!r}")
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        manifest = Manifest.read(tmp)
        if manifest.model_id != fields.get("model_id") or not answers_to(manifest, ref):
            raise TransferError(f"a peer sent the index of another model than {ref!r}")
        dest = fetched_folder(cache_dir, manifest.model_id)
        if not (dest / MANIFEST_FILE).is_file():
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        return dest
    except OSError as e:
        raise CacheWriteError(f"cannot write the model index under {cache_dir}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def fetch_index(
    client: PeerClient, addresses: Sequence[str], ref: str, cache_dir: Path
) -> list[str]:
    """Learn the model `ref` names from the first of `addresses` that serves it: its index
    goes into the cache, where ModelStore.open finds it. Returns the peers serving it.
    ModelNotFoundError where every peer asked (or none, when none is given) serves no such
    model; TransferError where one could not be asked."""
    why = []
    unreached = False  # a peer that could not be asked might have served it
    for address in addresses:
        try:
            reply = await client.ask(address, Request(Ask.INDEX, ref), MAX_INDEX_BYTES)
        except TransferError as e:
            why.append(str(e))
            unreached = True
            continue
        if reply.error is not None:
            why.append(f"{address}: {reply.error}")
            continue
        await asyncio.to_thread(write_index, reply.fields, ref, cache_dir)
        peers = reply.fields.get("peers")
        return (
            [address, *(str(p) for p in peers if p != address)]
            if isinstance(peers, list)
            else [address]
        )
    message = f"no peer serves model {ref!r} ({'; '.join(why) or 'no --join address given'})"
    # every peer asked said no, or none was given: what the node was started with is wrong
    raise TransferError(message) if unreached else ModelNotFoundError(message)
