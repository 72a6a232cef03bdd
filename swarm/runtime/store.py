"""The model store: resolves a model reference, indexes it once, fills the per-layer cache one
part at a time as parts are first loaded, and loads parts with every parameter checked by
name, shape and file hash. GGUF matrices come back as `PackedTensor`s (their blocks)."""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from swarm.errors import CorruptModelError, ModelError
from swarm.runtime import ggml
from swarm.runtime.convert import (
    CONVERTER_VERSION,
    HASH_SUFFIX,
    TOKENIZER_DIR,
    Checkpoint,
    build_index,
)
from swarm.runtime.layout import EMBED, HEAD, layer_part
from swarm.runtime.manifest import MANIFEST_FILE, Manifest, PartRecord
from swarm.runtime.packed import PackedTensor, Source
from swarm.runtime.source import ModelSource, resolve_model
from swarm.types import LayerSpan

Part = dict[str, Source]


class ModelStore:
    def __init__(self, folder: Path, manifest: Manifest, source: ModelSource) -> None:
        self.folder = folder
        self.manifest = manifest
        self.source = source
        self._checkpoint: Checkpoint | None = None
        self._filling = threading.Lock()  # one part extraction at a time in this process

    @classmethod
    def open(cls, ref: str, cache_dir: Path, progress: bool = True) -> ModelStore:
        """Open the cache for `ref`, indexing the checkpoint first if it is not cached yet.
        No part is read until it is loaded. (`progress` is kept for callers; indexing reads
        headers only and is quick.)"""
        source = resolve_model(ref)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", source.path.stem)[:48]
        # keyed on the checkpoint and the converter: a store an older converter wrote is
        # never reused, the checkpoint is converted again into a new folder
        key = f"{source.fingerprint()}-c{CONVERTER_VERSION}"
        folder = cache_dir.expanduser() / f"{slug}-{key}"
        if not (folder / MANIFEST_FILE).is_file():
            build_index(source, folder)
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

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.folder / TOKENIZER_DIR))
        except (OSError, ValueError) as e:
            raise CorruptModelError(
                f"model cache {self.folder}: unreadable tokenizer: {e}"
            ) from None

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

    def part_bytes(self, part: str) -> int:
        return self._record(part).nbytes

    def load_part(self, part: str) -> Part:
        record = self._record(part)
        path = self.folder / record.file
        if not path.is_file():
            with self._filling:
                if not path.is_file():
                    self._source().extract(record, self.folder)
        hash_file = path.with_name(path.name + HASH_SUFFIX)
        expected = hash_file.read_text().strip() if hash_file.is_file() else None
        # read, not mapped: tensors viewing a mapped file would keep all of it resident as
        # long as any one of them (a norm) lives
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != expected:
            raise CorruptModelError(
                f"{path} does not match its recorded hash; delete {self.folder} to convert again"
            )
        try:
            tensors = load(data)
        except (SafetensorError, OSError) as e:
            raise CorruptModelError(f"{path} is not a readable safetensors file: {e}") from None
        return _check_params(path, tensors, record)

    def _record(self, part: str) -> PartRecord:
        record = self.manifest.parts.get(part)
        if record is None:
            raise ModelError(f"model cache {self.folder} has no part {part!r}")
        return record

    def _source(self) -> Checkpoint:
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.source, self.load_config())
        return self._checkpoint


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
    return out
