"""The per-layer cache of one checkpoint, written in two steps.

`build_index` reads only the checkpoint's headers (GGUF tensor table, safetensors headers) and
writes config, tokenizer and a manifest naming every part (embedding, each decoder layer, head),
its parameters, their quantization and where each one lies in the checkpoint. `extract_part`
later copies one part's tensors into its own safetensors file, when a node first needs it: a
node reads from the checkpoint only the parts it serves, never the rest of the model.

GGUF's quantized tensors are stored as their blocks, row by row (uint8 [rows, row_bytes]), with
the architecture's row permutation applied (transformers' tensor processor, run on the rows), so
the store never holds a float copy. Float tensors keep their dtype.

Both steps write into a temporary name renamed into place only when complete, so a crash never
leaves an index or a part that looks complete."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from swarm.errors import CacheWriteError, CorruptModelError
from swarm.runtime.checkpoint.gguf_file import GGUFTable, read_table
from swarm.runtime.checkpoint.gguf_metadata import (
    has_tokenizer,
    read_tokenizer_fields,
    write_fields,
)
from swarm.runtime.checkpoint.layout import (
    build_skeleton,
    layout_from_config,
    part_file,
    split_name,
)
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE, Manifest, PartRecord
from swarm.runtime.checkpoint.source import ModelSource, SourceKind
from swarm.runtime.families import SkeletonPaths, family_for
from swarm.runtime.weights import ggml
from swarm.types import ModelId

TOKENIZER_DIR = "tokenizer"
HASH_SUFFIX = ".sha256"
_KEY_SEPARATOR = "::"  # safetensors source keys: "<file>::<tensor name>"
# Part of every cache folder's key: raise it whenever a change here (or in a family's GGUF
# hooks) changes what a conversion writes, so stores written before are rebuilt, never reused.
# 2: GGUF tensor processors chosen by the file's architecture; family config fixes from GGUF.
# 3: GGUF matrices stored as their quantized blocks, parts copied out lazily.
# 4: a GGUF file's tokenizer kept as its raw fields, not transformers' conversion.
CONVERTER_VERSION = 4


@dataclass(frozen=True)
class _Entry:
    """One checkpoint tensor as its header describes it."""

    hf_name: str
    key: str  # where it lies: GGUF tensor name, or "<file>::<name>" in a folder
    shape: tuple[int, ...]  # the Hugging Face shape
    qtype: str | None  # GGUF block type, None for float tensors
    nbytes: int


def build_index(source: ModelSource, dest: Path) -> None:
    """Write config, tokenizer and manifest for `source` at `dest`; nothing else is read."""
    reader = read_table(source.path) if source.kind is SourceKind.GGUF else None
    for tensor in [] if reader is None else reader.tensors.values():
        ggml.check_supported(tensor.qtype, tensor.name)
    config, tokenizer = _read_config_and_tokenizer(source)
    family = family_for(config)  # an unsupported model is refused before any work
    if reader is not None:
        family.read_gguf(config, _gguf_reader(source.path))  # what transformers' reader misses
        family_for(config)
    entries = (
        list(_folder_entries(source.path))
        if reader is None
        else list(_gguf_entries(reader, config))
    )
    # raises before anything is written
    manifest = _manifest(source, config, family.paths, entries, _content_hash(source, reader))
    tmp = _temporary_folder(dest)
    try:
        config.save_pretrained(tmp)
        if isinstance(tokenizer, dict):  # a GGUF file's fields, read by swarm.runtime.text
            write_fields(tmp / TOKENIZER_DIR, tokenizer)
        else:
            tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
        _write_atomic(tmp / MANIFEST_FILE, manifest.to_json().encode())
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


def _temporary_folder(dest: Path) -> Path:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as e:
        raise CacheWriteError(
            f"cannot write the model cache under {dest.parent}: {e.strerror}"
        ) from None
    return tmp


def _manifest(
    source: ModelSource,
    config: Any,
    paths: SkeletonPaths,
    entries: list[_Entry],
    model_id: ModelId,
) -> Manifest:
    layout = layout_from_config(config, paths)
    parts: dict[str, dict[str, _Entry]] = {}
    for entry in entries:
        where = split_name(entry.hf_name, paths)
        if where is None:
            continue  # e.g. GGUF's rope_freqs: recomputed from the config
        part, name = where
        expected = layout.parts.get(part, {})
        if name not in expected:
            continue  # lm_head of a tied model: the head reuses the embedding
        if entry.shape != expected[name]:
            raise CorruptModelError(
                f"parameter {entry.hf_name} has shape {entry.shape}, "
                f"the config says {expected[name]}"
            )
        if name in parts.setdefault(part, {}):
            raise CorruptModelError(f"parameter {entry.hf_name} appears twice in the checkpoint")
        parts[part][name] = entry
    missing = [p for p in layout.parts if layout.parts[p].keys() != parts.get(p, {}).keys()]
    if missing:
        detail = ", ".join(
            f"{p} ({', '.join(sorted(set(layout.parts[p]) - set(parts.get(p, {}))))})"
            for p in missing[:3]
        )
        raise CorruptModelError(f"checkpoint is incomplete: missing parameters in {detail}")
    return Manifest(
        model_id=model_id,
        source=source.name,
        model_type=str(config.model_type),
        num_layers=layout.num_layers,
        hidden_size=int(config.hidden_size),
        tie_word_embeddings=layout.tie_word_embeddings,
        parts={part: _record(part, parts[part]) for part in layout.parts},
    )


def _record(part: str, entries: dict[str, _Entry]) -> PartRecord:
    return PartRecord(
        file=part_file(part),
        params={name: e.shape for name, e in entries.items()},
        quant={name: e.qtype for name, e in entries.items() if e.qtype is not None},
        keys={name: e.key for name, e in entries.items()},
        nbytes=sum(e.nbytes for e in entries.values()),
    )


def _read_config_and_tokenizer(source: ModelSource) -> tuple[Any, Any]:
    """The config, and the tokenizer: transformers' for a folder, a GGUF file's own
    fields for a GGUF file (transformers' conversion of those gives other ids than
    llama.cpp's, and takes half a minute for a large vocabulary)."""
    from transformers import AutoConfig, AutoTokenizer

    if source.kind is SourceKind.GGUF:
        where, kwargs = str(source.path.parent), {"gguf_file": source.path.name}
        fields = read_tokenizer_fields(source.path)
        if not has_tokenizer(fields):
            raise CorruptModelError(
                f"{source.name}: the GGUF file has no tokenizer (no tokenizer.ggml.model)"
            )
        tokenizer: Any = fields
    else:
        where, kwargs, tokenizer = str(source.path), {}, None
    try:
        config = AutoConfig.from_pretrained(where, **kwargs)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError) as e:
        raise CorruptModelError(
            f"{source.name}: cannot read the model's config or tokenizer: {e}"
        ) from None
    # The cache's config describes plain tensors; the GGUF note would mislead later loads.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config, tokenizer


def _gguf_entries(reader: GGUFTable, config: Any) -> Iterator[_Entry]:
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    processor = _processor(config, reader.architecture)
    name_map = get_gguf_hf_weights_map(
        build_skeleton(config), processor, model_type=reader.architecture
    )
    for tensor in reader.tensors.values():
        if tensor.name not in name_map:
            continue
        yield _Entry(
            name_map[tensor.name],
            tensor.name,
            tuple(reversed(tensor.shape)),
            None if tensor.qtype in ggml.FLOAT_TYPES else tensor.qtype,
            tensor.nbytes,
        )


def _processor(config: Any, architecture: str) -> Any:
    """Keyed by the file's architecture, not transformers' model type: the processor undoes
    what llama.cpp did when writing this file (Llama's q/k row order, Gemma's norms + 1)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())


def _gguf_reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CorruptModelError(f"{path}: not a readable GGUF file: {e}") from None


def _folder_entries(folder: Path) -> Iterator[_Entry]:
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    piece = f.get_slice(key)
                    shape = tuple(int(d) for d in piece.get_shape())
                    size = torch.empty((), dtype=_TORCH_DTYPES[piece.get_dtype()]).element_size()
                    yield _Entry(
                        key,
                        f"{file.name}{_KEY_SEPARATOR}{key}",
                        shape,
                        None,
                        int(np.prod(shape)) * size,
                    )
        except (SafetensorError, KeyError) as e:
            raise CorruptModelError(f"{file}: not a readable safetensors file: {e}") from None


_TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


class Checkpoint:
    """Reads single parts out of one checkpoint; the GGUF header is parsed once."""

    def __init__(self, source: ModelSource, config: Any) -> None:
        self.source = source
        self.config = config
        self._table: GGUFTable | None = None

    def read(self, record: PartRecord) -> dict[str, torch.Tensor]:
        """One part's tensors as the store keeps them."""
        if self.source.kind is SourceKind.GGUF:
            return self._gguf_part(record)
        return _folder_part(self.source.path, record)

    def extract(self, record: PartRecord, folder: Path) -> None:
        """Copy one part's tensors into `folder`, with its hash beside it."""
        tensors = self.read(record)
        check_scales(str(self.source.path), tensors, record)  # before anything is written
        path = folder / record.file
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            save_file(tensors, str(tmp))
            _write_atomic(path.with_name(path.name + HASH_SUFFIX), file_sha256(tmp).encode())
            tmp.rename(path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CacheWriteError(f"cannot write {path}: {e}") from None

    def _gguf_part(self, record: PartRecord) -> dict[str, torch.Tensor]:
        path = self.source.path
        if self._table is None:
            self._table = read_table(path)
        processor = _processor(self.config, self._table.architecture)
        out = {}
        for name, key in record.keys.items():
            if key not in self._table.tensors:
                raise CorruptModelError(f"{path}: tensor {key} is gone; the file changed")
            raw = self._table.read(key)
            # the processor's row permutation (e.g. Llama's q/k) commutes with row-wise blocks
            result = processor.process(
                weights=raw,
                name=key,
                tensor_key_mapping={},
                parsed_parameters={"config": self.config.to_dict(), "tensors": {}},
            )
            if result.weights.shape != raw.shape:
                raise CorruptModelError(f"{path}: {key} cannot be stored as quantized rows")
            tensor = torch.from_numpy(np.ascontiguousarray(result.weights).copy())
            if self._table.tensors[key].qtype == "BF16":  # numpy has no bfloat16: raw bits
                tensor = tensor.view(torch.int16).view(torch.bfloat16)
            out[name] = tensor
        return out


def check_scales(where: str, tensors: dict[str, torch.Tensor], record: PartRecord) -> None:
    """Refuse a part with a quantized block whose float16 scale is inf or NaN: every product
    through that block would be too, and nothing downstream could say where it came from."""
    for name, qtype in record.quant.items():
        if name not in tensors:
            continue
        block = ggml.first_bad_block(qtype, tensors[name])
        if block is not None:
            raise CorruptModelError(
                f"{where}: tensor {record.keys.get(name, name)} ({qtype}) has a scale that is "
                f"not finite in block {block}"
            )


def _folder_part(folder: Path, record: PartRecord) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    out = {}
    for name, key in record.keys.items():
        file, _, inner = key.partition(_KEY_SEPARATOR)
        try:
            with safe_open(str(folder / file), framework="pt") as f:
                out[name] = f.get_tensor(inner).contiguous()
        except (SafetensorError, OSError) as e:
            raise CorruptModelError(f"{folder / file}: cannot read {inner}: {e}") from None
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _content_hash(source: ModelSource, reader: GGUFTable | None) -> ModelId:
    """The checkpoint's identity from its headers (metadata, tensor names, types, shapes and
    offsets) and sizes, so that no node reads the whole model to know which one it is."""
    h = hashlib.sha256()
    for file in source.files():
        h.update(file.name.encode() + b"\0" + str(file.stat().st_size).encode() + b"\0")
        with file.open("rb") as f:
            if file.suffix == ".safetensors":
                head = f.read(8)
                h.update(head + f.read(int.from_bytes(head, "little") if len(head) == 8 else 0))
            elif reader is not None:
                h.update(f.read(reader.data_offset))  # metadata and tensor table
            else:
                h.update(f.read())
    return ModelId(h.hexdigest())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    tmp.rename(path)
