"""The model store: resolves a model reference, converts it once into the per-layer cache, and
loads parts from that cache with every parameter checked by name, shape and file hash."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from swarm.errors import CorruptModelError, ModelError
from swarm.runtime.convert import CONVERTER_VERSION, TOKENIZER_DIR, convert, file_sha256
from swarm.runtime.layout import EMBED, HEAD, layer_part
from swarm.runtime.manifest import MANIFEST_FILE, Manifest
from swarm.runtime.source import resolve_model
from swarm.types import LayerSpan


@dataclass(frozen=True)
class ModelStore:
    folder: Path
    manifest: Manifest

    @classmethod
    def open(cls, ref: str, cache_dir: Path, progress: bool = True) -> ModelStore:
        """Open the cache for `ref`, converting the checkpoint first if it is not cached yet."""
        source = resolve_model(ref)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", source.path.stem)[:48]
        # keyed on the checkpoint and the converter: a store an older converter wrote is
        # never reused, the checkpoint is converted again into a new folder
        key = f"{source.fingerprint()}-c{CONVERTER_VERSION}"
        folder = cache_dir.expanduser() / f"{slug}-{key}"
        if not (folder / MANIFEST_FILE).is_file():
            convert(source, folder, progress=progress)
        return cls(folder=folder, manifest=Manifest.read(folder))

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

    def load_layer(self, index: int) -> dict[str, torch.Tensor]:
        LayerSpan(index, index + 1).check_within(self.num_layers)
        return self.load_part(layer_part(index))

    def load_embedding(self) -> dict[str, torch.Tensor]:
        return self.load_part(EMBED)

    def load_head(self) -> dict[str, torch.Tensor]:
        """Final norm and lm_head; a tied model's lm_head is the embedding matrix."""
        head = self.load_part(HEAD)
        if self.manifest.tie_word_embeddings:
            head["lm_head.weight"] = self.load_embedding()["embed_tokens.weight"]
        return head

    def load_part(self, part: str) -> dict[str, torch.Tensor]:
        record = self.manifest.parts.get(part)
        if record is None:
            raise ModelError(f"model cache {self.folder} has no part {part!r}")
        path = self.folder / record.file
        if not path.is_file():
            raise CorruptModelError(f"{path} is missing; delete {self.folder} to convert again")
        if file_sha256(path) != record.sha256:
            raise CorruptModelError(
                f"{path} does not match its manifest hash; delete {self.folder} to convert again"
            )
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise CorruptModelError(f"{path} is not a readable safetensors file: {e}") from None
        _check_params(path, tensors, record.params)
        return tensors


def _check_params(
    path: Path, tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]
) -> None:
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CorruptModelError(f"{path}: missing parameters {missing}, unexpected {extra}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise CorruptModelError(
                f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}"
            )
