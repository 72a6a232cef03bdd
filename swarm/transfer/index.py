"""Writing a model's index (manifest, config, tokenizer) that a peer sent into the cache."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from swarm.errors import CacheWriteError, TransferError
from swarm.runtime.manifest import MANIFEST_FILE, Manifest
from swarm.runtime.store import answers_to, fetched_folder


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
