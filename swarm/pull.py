"""`swarm pull` and `swarm models`: a machine's model cache filled before it goes offline, and
what it holds.

Pulling does what a node does when it first needs a part, for every part at once, through the
same code: a local GGUF file or Hugging Face folder (or the embedded model) is indexed and each
part copied out of it (swarm.runtime.checkpoint.store); a hub repository is indexed from the
hub and each part downloaded and cut out (swarm.transfer.hub). A node later started on the
same reference and cache finds every part stored; one on a hub repository whose hub cannot be
reached then runs the copy pulled here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.errors import CorruptModelError, ModelError
from swarm.runtime.checkpoint.convert import Checkpoint
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE, Manifest
from swarm.runtime.checkpoint.source import hub_ref
from swarm.runtime.checkpoint.store import ModelStore
from swarm.transfer.hub import open_hub, store_part

Bar = Callable[[int, str], Any]  # (total bytes, description) -> a tqdm-like bar


@dataclass(frozen=True)
class CachedModel:
    """One model store in the cache, as `swarm models` lists it."""

    folder: Path
    model_id: str  # "" when the manifest cannot be read
    source: str  # what the model was opened as (a name, a path, a hub repository)
    parts_held: int
    parts_total: int
    bytes_held: int  # bytes of the stored part files
    problem: str = ""  # why the store cannot be read, when it cannot


def pull(ref: str, cache_dir: Path, timeout_s: float, bar: Bar) -> CachedModel:
    """Store every part of `ref` in `cache_dir`; ModelNotFoundError for an unknown model,
    TransferError when the hub cannot be reached."""
    hub = hub_ref(ref)
    if hub is None:
        store = ModelStore.open(ref, cache_dir)
        # a store a peer indexed (no file here) holds only what peers sent
        missing = _missing(store) if store.has_checkpoint else []
        with bar(sum(store.part_bytes(p) for p in missing), f"converting {ref}") as progress:
            for part in missing:
                store.load_part(part)  # copies the part out of the file, and checks it
                progress.update(store.part_bytes(part))
        return describe(store.folder)
    model = open_hub(hub, ref, cache_dir, timeout_s)
    store = ModelStore.open(model.model_id, cache_dir)
    missing = _missing(store)
    records = [store.manifest.parts[p] for p in missing]
    with bar(model.bytes_needed(*records), f"downloading {hub}") as progress:
        checkpoint = Checkpoint(model.checkpoint_source(), store.load_config())
        for part, record in zip(missing, records, strict=True):
            model.bring(record, progress.update)
            store_part(store, checkpoint, part)
    return describe(store.folder)


def _missing(store: ModelStore) -> list[str]:
    held = set(store.stored_parts())
    return [p for p in store.manifest.parts if p not in held]


def cached_models(cache_dir: Path) -> list[CachedModel]:
    """Every model store under `cache_dir`, converted from a file here or fetched."""
    root = cache_dir.expanduser()
    if not root.is_dir():
        return []
    return [describe(f) for f in sorted(root.iterdir()) if (f / MANIFEST_FILE).is_file()]


def describe(folder: Path) -> CachedModel:
    try:
        manifest = Manifest.read(folder)
    except CorruptModelError as e:  # e.g. written by an older converter: never reused
        return CachedModel(folder, "", "", 0, 0, _bytes_on_disk(folder), str(e))
    held = [r for r in manifest.parts.values() if (folder / r.file).is_file()]
    return CachedModel(
        folder,
        manifest.model_id,
        manifest.source,
        len(held),
        len(manifest.parts),
        sum((folder / r.file).stat().st_size for r in held),
    )


def hub_download_bytes(cache_dir: Path) -> int:
    """Disk taken by what was downloaded from hubs (sparse copies count their blocks only)."""
    return _bytes_on_disk(cache_dir.expanduser() / "hub")


def _bytes_on_disk(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in _files(folder))


def _files(folder: Path) -> Iterator[Path]:
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if not path.is_symlink():
                yield path


def models_table(models: list[CachedModel], downloads: int, cache_dir: Path) -> list[str]:
    """What `swarm models` prints: a line per store (the source last: paths are long), then
    the hub downloads kept, if any."""
    if not models:
        return [f"no models in {cache_dir}; `swarm pull MODEL` stores one"]
    lines = [f"{'model id':18}{'parts':>9}{'MB':>10}  source"]
    for m in models:
        size = f"{m.bytes_held / 1e6:10.1f}"
        if m.problem:
            lines.append(f"{'-':18}{'-':>9}{size}  {m.folder.name}: {m.problem}")
        else:
            parts = f"{m.parts_held}/{m.parts_total}"
            lines.append(f"{m.model_id[:16]:18}{parts:>9}{size}  {m.source}")
    if downloads:
        lines.append(
            f"downloads from hubs kept for conversion: {downloads / 1e6:.1f} MB in {cache_dir}/hub"
        )
    return lines


def progress_bar(total: int, description: str) -> Any:
    """A tqdm bar in bytes on stderr (a Bar)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="B", unit_scale=True, file=sys.stderr)


def check_pulled(model: CachedModel) -> None:
    """A pull that could not store every part (a store only peers can fill) is an error."""
    if model.parts_held < model.parts_total:
        raise ModelError(
            f"{model.source}: {model.parts_held} of {model.parts_total} parts are here and "
            "only peers hold the rest; start a node with --join to fetch them"
        )
