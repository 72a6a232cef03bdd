"""A model from a repository on a Hugging Face hub, of which a node downloads only what it
needs: config and tokenizer, the headers of the weights, then, part by part as it is given
layers, the safetensors shards holding them or, for a GGUF, the byte ranges of their tensors.

Under `<cache>/hub/<owner>--<name>/<commit>/`, `index/` mirrors the repository: config and
tokenizer whole, and each weight file as a sparse copy of its full size holding its header.
The converter indexes that mirror like any local checkpoint (headers only), so the model's
identity is the one a node holding the real files computes, and nodes of both kinds form one
swarm. The store is a fetched one (`peer-<id>`, no checkpoint): a part exists only once its
bytes arrived, so a sparse hole is never read as weights. Whole shards land in `files/`.

Parts come from peers first, when some peer holds them (a LAN is faster than the internet and
a peer's part is checked against its digest like any other), else from the hub."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import save_file

from swarm.config import TransferConfig
from swarm.errors import CacheWriteError, CorruptModelError, ModelNotFoundError, TransferError
from swarm.runtime.checkpoint.convert import Checkpoint, build_index
from swarm.runtime.checkpoint.gguf_file import GGUFTable, read_table, table_from_head
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE, Manifest, PartDigest, PartRecord
from swarm.runtime.checkpoint.source import HubRef, ModelSource, SourceKind
from swarm.runtime.checkpoint.store import ModelStore, fetched_folder
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.hub_files import HubRepo, Progress, cache_errors
from swarm.types import ModelId

log = logging.getLogger(__name__)

SHARD_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# what transformers reads to build a config and a tokenizer; weights and the rest stay there
INDEX_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        SHARD_INDEX,
    }
)
HEAD_BYTES = 64 * 1024  # first read of a weight file's header; more when it is longer
MAX_HEAD_BYTES = 1 << 30  # a GGUF header (vocabulary included) past this is refused
# GGUF tensors the parts are made of (llama.cpp's names); a sparse copy holds no others' holes
PART_TENSORS = ("blk.", "token_embd.", "output.", "output_norm.")
_KEY_SEPARATOR = "::"  # how the converter names a tensor of a folder: "<file>::<name>"


@dataclass(frozen=True)
class HubModel:
    repo: HubRepo
    source: ModelSource  # the mirror in index/: a sparse GGUF, or a folder of sparse shards
    gguf: str | None  # the GGUF file's name in the repository
    files: Path  # whole shards, downloaded and checked
    model_id: ModelId

    def bytes_needed(self, *records: PartRecord) -> int:
        """What downloading `records` would move (whole shards, each once; a GGUF's ranges)."""
        if self.gguf is None:
            shards = {s for record in records for s in self._shards(record)}
            return sum(self.repo.remote(s).size for s in shards)
        return sum(end - start for record in records for start, end in self._ranges(record))

    def bring(self, record: PartRecord, progress: Progress) -> None:
        """Download what `record`'s tensors lie in, unless it is here already."""
        if self.gguf is None:
            for shard in self._shards(record):
                self.repo.download(shard, self.files / shard, progress)
        else:
            self.repo.fetch_ranges(self.gguf, self.source.path, self._ranges(record), progress)

    def checkpoint_source(self) -> ModelSource:
        """Where `bring` put the bytes, as a checkpoint the converter reads parts from."""
        if self.gguf is None:
            return ModelSource(SourceKind.HF_FOLDER, self.files, self.source.name)
        return self.source

    def _shards(self, record: PartRecord) -> list[str]:
        shards = sorted({key.partition(_KEY_SEPARATOR)[0] for key in record.keys.values()})
        return [s for s in shards if not (self.files / s).is_file()]

    def _ranges(self, record: PartRecord) -> list[tuple[int, int]]:
        table = _table(self.source.path)
        tensors = [table.tensors[key] for key in record.keys.values()]
        spans = sorted((t.offset, t.offset + t.nbytes) for t in tensors)
        merged: list[tuple[int, int]] = []
        for start, end in spans:  # a layer's tensors lie together, split by alignment only
            if merged and start - merged[-1][1] < 4096:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged


@lru_cache(maxsize=4)
def _table(path: Path) -> GGUFTable:
    return read_table(path)  # the header never changes; the holes after it fill in


def open_hub(ref: HubRef, name: str, cache_dir: Path, timeout_s: float) -> HubModel:
    """Index the repository `ref` names at its current commit (once per commit: the mirror
    and the store are kept), downloading config, tokenizer and headers only."""
    repo = HubRepo.open(ref, timeout_s)
    gguf = _choose_gguf(ref, repo.files)
    cache_dir = cache_dir.expanduser()
    mirror = cache_dir / "hub" / ref.repo_id.replace("/", "--") / repo.commit
    index = mirror / "index"
    if not index.is_dir():
        _write_mirror(repo, gguf, index)
    kind = SourceKind.HF_FOLDER if gguf is None else SourceKind.GGUF
    source = ModelSource(kind, index if gguf is None else index / gguf, name)
    model_id = _indexed(source, mirror, cache_dir)
    with cache_errors(mirror):
        (mirror / "files").mkdir(exist_ok=True)
    log.info("model %s from %s at commit %s: id %s", name, ref.repo_id, repo.commit, model_id)
    return HubModel(repo, source, gguf, mirror / "files", model_id)


def _choose_gguf(ref: HubRef, files: list[str]) -> str | None:
    """The GGUF file to run, or None for the repository's safetensors weights."""
    ggufs = [f for f in files if f.endswith(".gguf")]
    if ref.file is not None:
        if ref.file not in files:
            raise ModelNotFoundError(
                f"{ref.repo_id} has no file {ref.file!r}; its GGUF files: "
                f"{', '.join(ggufs) or 'none'}"
            )
        return ref.file
    if SHARD_INDEX in files or SINGLE_FILE in files:
        return None
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ModelNotFoundError(
            f"{ref.repo_id} holds several GGUF files; choose one as {ref.repo_id}:FILE "
            f"({', '.join(ggufs[:6])}{', ...' if len(ggufs) > 6 else ''})"
        )
    raise ModelNotFoundError(f"{ref.repo_id} holds neither safetensors weights nor a GGUF file")


def _write_mirror(repo: HubRepo, gguf: str | None, index: Path) -> None:
    """config, tokenizer and sparse weight files with their headers, renamed into place whole."""
    tmp = index.with_name(f".{index.name}.tmp-{os.getpid()}")
    with cache_errors(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        if gguf is None:
            if "config.json" not in repo.files:
                raise ModelNotFoundError(f"{repo.ref.repo_id} has no config.json")
            for name in sorted(INDEX_FILES.intersection(repo.files)):
                repo.download(name, tmp / name, lambda n: None)
            for shard in _shard_names(repo, tmp):
                _sparse_copy(tmp / shard, repo.remote(shard).size, _safetensors_head(repo, shard))
        else:
            size = repo.remote(gguf).size
            head, table = _gguf_head(repo, gguf)
            _sparse_copy(tmp / gguf, size, head)
            # tensors of no part (Llama 3's rope_freqs) are read as the config is built
            extra = [
                (t.offset, t.offset + t.nbytes)
                for name, t in table.tensors.items()
                if not name.startswith(PART_TENSORS)
            ]
            repo.fetch_ranges(gguf, tmp / gguf, extra, lambda n: None)
        with cache_errors(index):
            try:
                tmp.rename(index)
            except OSError:
                if not index.is_dir():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _shard_names(repo: HubRepo, folder: Path) -> list[str]:
    if SHARD_INDEX not in repo.files:
        return [SINGLE_FILE]
    try:
        weight_map = json.loads((folder / SHARD_INDEX).read_text())["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptModelError(f"{repo.ref.repo_id}: unreadable {SHARD_INDEX}: {e}") from None
    missing = [s for s in shards if s not in repo.files or "/" in s or s.startswith(".")]
    if missing:
        raise ModelNotFoundError(
            f"{repo.ref.repo_id}: {SHARD_INDEX} names shards the repository lacks: {missing}"
        )
    return shards


def _safetensors_head(repo: HubRepo, name: str) -> bytes:
    size = repo.remote(name).size
    if size < 8:
        raise CorruptModelError(f"{repo.ref.repo_id}: {name} is not a safetensors file")
    head = repo.read(name, 0, min(size, HEAD_BYTES))
    length = 8 + int.from_bytes(head[:8], "little")
    if length > size:
        raise CorruptModelError(f"{repo.ref.repo_id}: {name} is not a safetensors file")
    if len(head) < length:
        head += repo.read(name, len(head), length)
    return head[:length]


def _gguf_head(repo: HubRepo, name: str) -> tuple[bytes, GGUFTable]:
    """The bytes before the tensor data, read in growing pieces until the table parses."""
    size = repo.remote(name).size
    head = b""
    want = HEAD_BYTES
    while True:
        head += repo.read(name, len(head), min(size, want))
        table = table_from_head(Path(name), head, size)
        if table is not None:
            return head[: table.data_offset], table
        if want >= MAX_HEAD_BYTES:
            raise CorruptModelError(f"{repo.ref.repo_id}: {name} has a header over 1 GiB")
        want *= 2  # reads at most twice the header


def _sparse_copy(path: Path, size: int, head: bytes) -> None:
    """A file of `size` bytes holding `head` and, after it, holes: they take no disk."""
    with cache_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            f.truncate(size)
            f.write(head)


def _indexed(source: ModelSource, mirror: Path, cache_dir: Path) -> ModelId:
    """Convert the mirror's headers into a store (once), named by the model's id."""
    known = mirror / "model_id"
    if known.is_file():
        model_id = ModelId(known.read_text().strip())
        if (fetched_folder(cache_dir, model_id) / MANIFEST_FILE).is_file():
            return model_id
    built = mirror / f".store-{os.getpid()}"
    shutil.rmtree(built, ignore_errors=True)
    build_index(source, built)
    try:
        model_id = Manifest.read(built).model_id
        dest = fetched_folder(cache_dir, model_id)
        with cache_errors(dest):
            if not (dest / MANIFEST_FILE).is_file():
                shutil.rmtree(dest, ignore_errors=True)
                built.rename(dest)
            known.write_text(model_id)
    finally:
        shutil.rmtree(built, ignore_errors=True)
    return model_id


class HubFetcher(Fetcher):
    """A Fetcher whose parts come from the peers that hold them, else from the hub."""

    def __init__(
        self, store: ModelStore, client: PeerClient, config: TransferConfig, hub: HubModel
    ) -> None:
        super().__init__(store, client, config)
        self._hub = hub
        self._checkpoint: Checkpoint | None = None

    async def fetch_part(self, part: str, peers: list[str]) -> None:
        if peers:
            try:
                await super().fetch_part(part, peers)
                return
            except TransferError as e:
                log.info("%s: no peer has it (%s); downloading it from the hub", part, e)
        await self._from_hub(part)

    async def _from_hub(self, part: str) -> None:
        record = self._store.manifest.parts[part]
        loop = asyncio.get_running_loop()

        def progress(nbytes: int) -> None:  # told on the worker thread
            loop.call_soon_threadsafe(self.progress.advance, nbytes)

        where = self._hub.repo.ref.repo_id
        try:
            needed = await asyncio.to_thread(self._hub.bytes_needed, record)
            self.progress.part(part, needed, self._store.part_bytes(part), [where])
            await asyncio.to_thread(self._hub.bring, record, progress)
            await asyncio.to_thread(self._store_part, part, record)
        except (ModelNotFoundError, CorruptModelError) as e:
            # as a TransferError, a move gives up for now instead of stopping the node
            raise TransferError(str(e)) from None
        self.progress.finished()
        log.info("fetched %s from %s (%d bytes downloaded)", part, where, needed)

    def _store_part(self, part: str, record: PartRecord) -> None:
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self._hub.checkpoint_source(), self._store.load_config())
        store_part(self._store, self._checkpoint, part)


def store_part(store: ModelStore, checkpoint: Checkpoint, part: str) -> None:
    """Cut the part out of the downloaded bytes (`checkpoint`: the hub model's
    `checkpoint_source()`), as a node holding the file would."""
    record = store.manifest.parts[part]
    tensors = checkpoint.read(record)
    tmp = store.folder / f".{record.file}.hub-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        save_file(tensors, str(tmp))
        digest = PartDigest.of(tmp.read_bytes())
    except (OSError, SafetensorError) as e:  # safetensors' own error for a full disk
        tmp.unlink(missing_ok=True)
        raise CacheWriteError(f"cannot write {tmp}: {e}") from None
    store.adopt(part, tmp, digest)


def pulled_before(ref: HubRef, cache_dir: Path) -> ModelId | None:
    """The model indexed from `ref` earlier (by `swarm pull` or a node), for a node whose hub
    cannot be reached now: the commit `ref` names, else the one indexed last."""
    repo = cache_dir.expanduser() / "hub" / ref.repo_id.replace("/", "--")
    known = sorted(repo.glob("*/model_id"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in sorted(known, key=lambda p: p.parent.name != ref.revision):  # stable: by age
        mirror = path.parent
        if ref.file is not None and not (mirror / "index" / ref.file).is_file():
            continue
        model_id = ModelId(path.read_text().strip())
        if (fetched_folder(cache_dir, model_id) / MANIFEST_FILE).is_file():
            return model_id
    return None
