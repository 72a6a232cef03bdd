"""Convert a checkpoint once into the per-layer cache: one safetensors file per decoder layer,
one for the embedding, one for the head, plus config, tokenizer and manifest.

Everything is written into a temporary folder that is renamed into place only when complete,
and the manifest is written last, so a crash mid-conversion never leaves a cache that looks
complete. Tensors stream part by part: memory holds one layer at a time, not the model."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from swarm.errors import CacheWriteError, CorruptModelError
from swarm.runtime.families import family_for
from swarm.runtime.layout import (
    ModelLayout,
    build_skeleton,
    layout_from_config,
    part_file,
    split_name,
)
from swarm.runtime.manifest import MANIFEST_FILE, Manifest, PartRecord
from swarm.runtime.source import ModelSource, SourceKind
from swarm.types import ModelId

TOKENIZER_DIR = "tokenizer"
# Part of every cache folder's key: raise it whenever a change here (or in a family's GGUF
# hooks) changes what a conversion writes, so stores written before are rebuilt, never reused.
# 2: GGUF tensor processors chosen by the file's architecture; family config fixes from GGUF.
CONVERTER_VERSION = 2


def convert(source: ModelSource, dest: Path, progress: bool = True) -> None:
    """Write the cache for `source` at `dest`; `dest` appears only once it is complete."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as e:
        raise CacheWriteError(
            f"cannot write the model cache under {dest.parent}: {e.strerror}"
        ) from None
    try:
        _convert_into(source, tmp, progress)
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / MANIFEST_FILE).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CacheWriteError(f"cannot write the model cache at {dest}: {e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _convert_into(source: ModelSource, tmp: Path, progress: bool) -> None:
    config, tokenizer = _read_config_and_tokenizer(source)
    family = family_for(config)  # an unsupported model is refused before any work
    reader = _gguf_reader(source.path) if source.kind is SourceKind.GGUF else None
    if reader is not None:
        family.read_gguf(config, reader)  # what transformers' GGUF config reader misses
        family_for(config)
    layout = layout_from_config(config)
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
    writer = _PartWriter(tmp, layout)
    tensors = (
        _gguf_tensors(source.path, reader, config)
        if reader is not None
        else _folder_tensors(source.path)
    )
    with tqdm(desc=f"converting {source.name}", unit="tensor", disable=not progress) as bar:
        for hf_name, tensor in tensors:
            writer.add(hf_name, tensor)
            bar.update(1)
    records = writer.finish()
    manifest = Manifest(
        model_id=_content_hash(source),
        source=source.name,
        model_type=str(config.model_type),
        num_layers=layout.num_layers,
        hidden_size=int(config.hidden_size),
        tie_word_embeddings=layout.tie_word_embeddings,
        parts=records,
    )
    _write_atomic(tmp / MANIFEST_FILE, manifest.to_json().encode())


def _read_config_and_tokenizer(source: ModelSource) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    if source.kind is SourceKind.GGUF:
        where, kwargs = str(source.path.parent), {"gguf_file": source.path.name}
    else:
        where, kwargs = str(source.path), {}
    try:
        config = AutoConfig.from_pretrained(where, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError) as e:
        raise CorruptModelError(
            f"{source.name}: cannot read the model's config or tokenizer: {e}"
        ) from None
    # The cache holds plain tensors; the GGUF quantization note would mislead later loads.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config, tokenizer


def _gguf_reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CorruptModelError(f"{path}: not a readable GGUF file: {e}") from None


def _gguf_tensors(path: Path, reader: Any, config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    import numpy as np
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    # Keyed by the file's architecture, not transformers' model type: the processor undoes
    # what llama.cpp did when writing this file (Llama's q/k row order, Gemma's norms + 1).
    architecture = str(reader.fields["general.architecture"].contents())
    processor_config = config.to_dict()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=processor_config)
    name_map = get_gguf_hf_weights_map(build_skeleton(config), processor, model_type=architecture)
    for tensor in reader.tensors:
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except (ValueError, NotImplementedError) as e:
            raise CorruptModelError(
                f"{path}: cannot dequantize tensor {tensor.name}: {e}"
            ) from None
        result = processor.process(
            weights=weights,
            name=tensor.name,
            tensor_key_mapping=name_map,
            parsed_parameters={"config": processor_config, "tensors": {}},
        )
        if result.name in name_map:
            yield (
                name_map[result.name],
                torch.from_numpy(np.ascontiguousarray(result.weights).copy()),
            )


def _folder_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield key, f.get_tensor(key)
        except SafetensorError as e:
            raise CorruptModelError(f"{file}: not a readable safetensors file: {e}") from None


class _PartWriter:
    """Collects tensors per part and writes each part as soon as all of its names arrived."""

    def __init__(self, folder: Path, layout: ModelLayout) -> None:
        self._folder = folder
        self._layout = layout
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self._written: dict[str, PartRecord] = {}

    def add(self, hf_name: str, tensor: torch.Tensor) -> None:
        where = split_name(hf_name)
        if where is None:
            return  # e.g. GGUF's rope_freqs: recomputed from the config
        part, name = where
        expected = self._layout.parts.get(part, {})
        if name not in expected:
            return  # lm_head of a tied model: the head reuses the embedding
        if tuple(tensor.shape) != expected[name]:
            raise CorruptModelError(
                f"parameter {hf_name} has shape {tuple(tensor.shape)}, "
                f"the config says {expected[name]}"
            )
        if part in self._written:
            raise CorruptModelError(f"parameter {hf_name} appears twice in the checkpoint")
        pending = self._pending.setdefault(part, {})
        pending[name] = tensor.contiguous()
        if pending.keys() == expected.keys():
            self._write(part, self._pending.pop(part))

    def _write(self, part: str, tensors: dict[str, torch.Tensor]) -> None:
        path = self._folder / part_file(part)
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.rename(path)
        params = {name: tuple(t.shape) for name, t in tensors.items()}
        self._written[part] = PartRecord(file=path.name, sha256=file_sha256(path), params=params)

    def _absent_names(self, part: str) -> list[str]:
        return sorted(set(self._layout.parts[part]) - set(self._pending.get(part, {})))

    def finish(self) -> dict[str, PartRecord]:
        missing = [p for p in self._layout.parts if p not in self._written]
        if missing:
            detail = ", ".join(f"{p} ({', '.join(self._absent_names(p))})" for p in missing[:3])
            raise CorruptModelError(f"checkpoint is incomplete: missing parameters in {detail}")
        return self._written


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _content_hash(source: ModelSource) -> ModelId:
    h = hashlib.sha256()
    for file in source.files():
        h.update(file.name.encode() + b"\0" + file_sha256(file).encode())
    return ModelId(h.hexdigest())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
