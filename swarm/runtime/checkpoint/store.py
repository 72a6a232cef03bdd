"""The model store: resolves a model reference, indexes it once, fills the per-layer cache one
part at a time as parts are first loaded, and loads parts with every parameter checked by
name, shape and file hash. GGUF matrices come back as `PackedTensor`s (their blocks).

A store without a checkpoint (a node that has no model file) was indexed by a peer: its parts
arrive from peers (swarm.transfer) and are adopted here once their digest checks."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from swarm.errors import CacheWriteError, CorruptModelError, ModelError, ModelNotFoundError
from swarm.runtime.checkpoint.content_key import file_digests, remember
from swarm.runtime.checkpoint.convert import (
    CONVERTER_VERSION,
    HASH_SUFFIX,
    TOKENIZER_DIR,
    Checkpoint,
    build_index,
    check_scales,
)
from swarm.runtime.checkpoint.layout import EMBED, HEAD, layer_part
from swarm.runtime.checkpoint.manifest import (
    DIGEST_SUFFIX,
    MANIFEST_FILE,
    Manifest,
    PartDigest,
    PartRecord,
)
from swarm.runtime.checkpoint.source import ModelSource, own_name, resolve_model
from swarm.runtime.weights import ggml, heap
from swarm.runtime.weights.packed import PackedTensor, Source
from swarm.types import LayerSpan, ModelId

Part = dict[str, Source]
log = logging.getLogger(__name__)
FETCHED_PREFIX = "peer-"  # cache folders indexed by a peer, for nodes without the file


class ModelStore:
    def __init__(self, folder: Path, manifest: Manifest, source: ModelSource | None) -> None:
        self.folder = folder
        self.manifest = manifest
        self.source = source
        self._checkpoint: Checkpoint | None = None
        self._filling = threading.Lock()  # one part extraction at a time in this process

    @classmethod
    def open(cls, ref: str, cache_dir: Path, progress: bool = True) -> ModelStore:
        """Open the cache for `ref`, indexing the checkpoint first if it is not cached yet.
        No part is read until it is loaded. (`progress` is kept for callers; indexing reads
        headers only and is quick.) The store's key hashes the whole checkpoint once per file
        version (about a second per GB): async callers run this off the event loop. A
        reference no local file answers to may name a model whose index a peer sent earlier
        (by id, id prefix or name): that store is opened."""
        try:
            source = resolve_model(ref)
        except ModelNotFoundError:
            fetched = find_fetched(cache_dir, ref)
            if fetched is None:
                raise
            return cls(folder=fetched, manifest=Manifest.read(fetched), source=None)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", source.path.stem)[:48]
        # keyed on the checkpoint's bytes and the converter: a store an older converter wrote,
        # or one of a file changed since, is never reused; the checkpoint is converted again
        digests = file_digests(source.files(), cache_dir)
        fingerprint = source.fingerprint({d.path: d.sha256 for d in digests})
        folder = cache_dir.expanduser() / f"{slug}-{fingerprint}-c{CONVERTER_VERSION}"
        if not (folder / MANIFEST_FILE).is_file():
            build_index(source, folder)
        remember(digests)  # only now: a checkpoint refused at indexing leaves nothing behind
        return cls(folder=folder, manifest=Manifest.read(folder), source=source)

    @property
    def num_layers(self) -> int:
        return self.manifest.num_layers

    def load_config(self) -> Any:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(self.folder))
        except (OSError, ValueError) as e:
            raise CorruptModelError(
                f"model cache {self.folder}: unreadable config.json: {e}"
            ) from None

    @property
    def tokenizer_folder(self) -> Path:
        """Where the tokenizer is kept: a Hugging Face tokenizer, or a GGUF file's raw
        tokenizer fields (swarm.runtime.text.tokenizer reads either)."""
        return self.folder / TOKENIZER_DIR

    def load_layer(self, index: int, keep: bool = True) -> Part:
        """`keep=False`: a layer not stored yet is read from the checkpoint without storing
        it (a speed probe on layers this node may never serve)."""
        LayerSpan(index, index + 1).check_within(self.num_layers)
        part = layer_part(index)
        record = self._record(part)
        if not keep and not (self.folder / record.file).is_file():
            return _check_params(self.folder / record.file, self._source().read(record), record)
        return self.load_part(part)

    def load_embedding(self) -> Part:
        return self.load_part(EMBED)

    def load_head(self) -> Part:
        """Final norm and lm_head; a tied model's lm_head is the embedding matrix."""
        head = self.load_part(HEAD)
        if self.manifest.tie_word_embeddings:
            head["lm_head.weight"] = self.load_embedding()["embed_tokens.weight"]
        return head

    def stored_parts(self) -> list[str]:
        """Parts already copied out of the checkpoint into this cache."""
        return [p for p, r in self.manifest.parts.items() if (self.folder / r.file).is_file()]

    @property
    def has_checkpoint(self) -> bool:
        """Whether this node holds the model file, so it can store any part itself."""
        return self.source is not None

    def missing(self, parts: list[str]) -> list[str]:
        """Of `parts`, those not stored here that only peers can provide."""
        if self.has_checkpoint:
            return []
        return [p for p in parts if not (self.folder / self._record(p).file).is_file()]

    def index_files(self) -> dict[str, bytes]:
        """The small files a peer needs to open this model: manifest, config, tokenizer."""
        parts = {r.file for r in self.manifest.parts.values()}
        out = {}
        for path in sorted(self.folder.rglob("*")):
            name = path.relative_to(self.folder).as_posix()
            stem = name.removesuffix(HASH_SUFFIX).removesuffix(DIGEST_SUFFIX)
            if path.is_file() and stem not in parts and not path.name.startswith("."):
                out[name] = path.read_bytes()
        return out

    def digest(self, part: str) -> PartDigest | None:
        """The digest of a stored part (stored first when this node has the file), or None
        when this node cannot provide it. Computed once, from a file that matched its hash,
        and kept beside it: what is served later is checked against it by the receiver."""
        record = self._record(part)
        path = self.folder / record.file
        side = path.with_name(path.name + DIGEST_SUFFIX)
        if side.is_file():
            return PartDigest.from_json(json.loads(side.read_text()))
        if not path.is_file() and not self.has_checkpoint:
            return None
        self.load_part(part)  # stores it, and checks its hash
        digest = PartDigest.of(path.read_bytes())
        if digest.sha256 != self._recorded_hash(path):
            raise CorruptModelError(f"{path} changed while it was read")
        _write_new(side, json.dumps(digest.to_json()).encode())
        return digest

    def read_range(self, part: str, start: int, end: int) -> bytes:
        with (self.folder / self._record(part).file).open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def adopt(self, part: str, received: Path, digest: PartDigest) -> None:
        """Store `received` (a whole part that matched `digest`) as `part`."""
        path = self.folder / self._record(part).file
        try:
            _write_new(path.with_name(path.name + HASH_SUFFIX), digest.sha256.encode())
            _write_new(
                path.with_name(path.name + DIGEST_SUFFIX), json.dumps(digest.to_json()).encode()
            )
            received.rename(path)
        except OSError as e:
            raise CacheWriteError(f"cannot store {path}: {e}") from None

    def part_bytes(self, part: str) -> int:
        return self._record(part).nbytes

    def load_part(self, part: str) -> Part:
        """A stored part, checked against its recorded hash. A file that no longer matches
        (changed on disk, a bad sector) is discarded and never loaded: stored again from the
        model file where this node has it, else left missing so that the next fetch brings
        it from a peer (`CorruptModelError` says so)."""
        record = self._record(part)
        path = self.folder / record.file
        data = self._stored_bytes(part, record, path)
        if data is None:
            self._discard(path)
            if not self.has_checkpoint:
                raise CorruptModelError(
                    f"{path} did not match its recorded hash: discarded, to be fetched again"
                    " from a peer"
                )
            log.warning(
                "%s did not match its recorded hash: discarded, stored again from the model file",
                path,
            )
            data = self._stored_bytes(part, record, path)
            if data is None:
                raise CorruptModelError(
                    f"{path} does not match its recorded hash right after it was stored"
                    f" again; delete {self.folder} to convert again"
                )
        try:
            tensors = load(data)
        except (SafetensorError, OSError) as e:
            raise CorruptModelError(f"{path} is not a readable safetensors file: {e}") from None
        del data
        # placed once, here: the kernels stream them from memory, and a tied head and
        # embedding keep sharing one tensor
        placed = {name: heap.on_huge_pages(t) for name, t in tensors.items()}
        return _check_params(path, placed, record)

    def discard_changed(self, parts: list[str]) -> list[str]:
        """Of `parts`, those stored here whose bytes no longer match their recorded hash,
        discarded (so a fetch brings them again instead of a load failing on them)."""
        changed = []
        for part in parts:
            path = self.folder / self._record(part).file
            if path.is_file() and not self._matches(path, path.read_bytes()):
                self._discard(path)
                changed.append(part)
        return changed

    def _stored_bytes(self, part: str, record: PartRecord, path: Path) -> bytes | None:
        """The part's file, stored first from the model file where this node has it; None
        when its bytes do not match the hash recorded when it was stored."""
        if not path.is_file() and self.has_checkpoint:
            with self._filling:
                if not path.is_file():
                    self._source().extract(record, self.folder)
        if not path.is_file():
            raise ModelError(f"{part} is not stored here yet; it is fetched from a peer first")
        # read, not mapped: tensors viewing a mapped file would keep all of it resident as
        # long as any one of them (a norm) lives
        data = path.read_bytes()
        return data if self._matches(path, data) else None

    def _matches(self, path: Path, data: bytes) -> bool:
        return hashlib.sha256(data).hexdigest() == self._recorded_hash(path)

    def _discard(self, path: Path) -> None:
        """Remove a part file and what was recorded beside it, so nothing takes it as stored."""
        with self._filling:
            for suffix in (DIGEST_SUFFIX, HASH_SUFFIX, ""):
                path.with_name(path.name + suffix).unlink(missing_ok=True)

    def _record(self, part: str) -> PartRecord:
        record = self.manifest.parts.get(part)
        if record is None:
            raise ModelError(f"model cache {self.folder} has no part {part!r}")
        return record

    def _source(self) -> Checkpoint:
        if self.source is None:
            raise ModelError(f"model cache {self.folder} has no checkpoint to read parts from")
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.source, self.load_config())
        return self._checkpoint

    @staticmethod
    def _recorded_hash(path: Path) -> str | None:
        hash_file = path.with_name(path.name + HASH_SUFFIX)
        return hash_file.read_text().strip() if hash_file.is_file() else None


def fetched_folder(cache_dir: Path, model_id: ModelId) -> Path:
    """Where a store indexed by a peer lives."""
    return cache_dir.expanduser() / f"{FETCHED_PREFIX}{model_id[:24]}"


def answers_to(manifest: Manifest, ref: str) -> bool:
    """Whether `ref` names this model: its id, an id prefix of 8+ hex digits, or its name."""
    if ref == manifest.model_id or (len(ref) >= 8 and manifest.model_id.startswith(ref)):
        return True
    return ref == own_name(manifest.source)


def find_fetched(cache_dir: Path, ref: str) -> Path | None:
    for folder in sorted(cache_dir.expanduser().glob(f"{FETCHED_PREFIX}*")):
        if (folder / MANIFEST_FILE).is_file() and answers_to(Manifest.read(folder), ref):
            return folder
    return None


def _write_new(path: Path, data: bytes) -> None:
    # a temporary name of this writer's own: peers asking for the same part at once make
    # threads of one process write the same file (a shared name let one rename the other's)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _check_params(path: Path, tensors: dict[str, torch.Tensor], record: PartRecord) -> Part:
    missing = sorted(set(record.params) - set(tensors))
    extra = sorted(set(tensors) - set(record.params))
    if missing or extra:
        raise CorruptModelError(f"{path}: missing parameters {missing}, unexpected {extra}")
    out: Part = {}
    for name, shape in record.params.items():
        qtype = record.quant.get(name)
        stored = shape if qtype is None else (shape[0], ggml.row_bytes(qtype, shape[-1]))
        if tuple(tensors[name].shape) != stored:
            raise CorruptModelError(
                f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {stored}"
            )
        out[name] = tensors[name] if qtype is None else PackedTensor(qtype, tensors[name], shape[1])
    check_scales(str(path), tensors, record)  # a part a peer sent, or one stored before this check
    return out
