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

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from swarm.errors import CacheWriteError, CorruptModelError
from swarm.runtime.checkpoint import gguf_experts
from swarm.runtime.checkpoint.entries import (
    KEY_SEPARATOR,
    Entry,
    folder_entries,
    gguf_entries,
    gguf_reader,
    own_gguf_config,
    processor,
)
from swarm.runtime.checkpoint.gguf_file import (
    GGUFTable,
    HeaderCopy,
    read_table,
    write_header_copy,
)
from swarm.runtime.checkpoint.gguf_metadata import (
    has_tokenizer,
    read_tokenizer_fields,
    write_fields,
)
from swarm.runtime.checkpoint.layout import (
    layout_from_config,
    part_file,
    split_name,
)
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE, Manifest, PartRecord
from swarm.runtime.checkpoint.source import ModelSource, SourceKind
from swarm.runtime.families import (
    Family,
    config_from_gguf,
    family_for,
    refuse_gguf_architecture,
)
from swarm.runtime.weights import ggml
from swarm.types import ModelId

TOKENIZER_DIR = "tokenizer"
HASH_SUFFIX = ".sha256"
# Part of every cache folder's key: raise it whenever a change here (or in a family's GGUF
# hooks) changes what a conversion writes, so stores written before are rebuilt, never reused.
# 2: GGUF tensor processors chosen by the file's architecture; family config fixes from GGUF.
# 3: GGUF matrices stored as their quantized blocks, parts copied out lazily.
# 4: a GGUF file's tokenizer kept as its raw fields, not transformers' conversion.
CONVERTER_VERSION = 4


def build_index(source: ModelSource, dest: Path) -> None:
    """Write config, tokenizer and manifest for `source` at `dest`; nothing else is read."""
    reader = read_table(source.path) if source.kind is SourceKind.GGUF else None
    if reader is not None:
        refuse_gguf_architecture(reader.architecture)
    for tensor in [] if reader is None else reader.tensors.values():
        ggml.check_supported(tensor.qtype, tensor.name)
    with _header_copy(source, dest) as header:
        config, tokenizer = _read_config_and_tokenizer(source, header)
        fields = None if header is None else gguf_reader(header.path)
        if fields is not None:
            config = config_from_gguf(config, fields)
        family = family_for(config)  # an unsupported model is refused before any work
        if fields is not None:
            family.read_gguf(config, fields)  # what transformers' reader misses
            family_for(config)
    entries = (
        list(folder_entries(source.path))
        if reader is None
        else list(gguf_entries(reader, config, family.paths))
    )
    # raises before anything is written
    manifest = _manifest(source, config, family, entries, _content_hash(source, reader))
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


@contextlib.contextmanager
def _header_copy(source: ModelSource, dest: Path) -> Iterator[HeaderCopy | None]:
    """A GGUF source's header without its vocabulary's arrays, beside `dest` while the index
    is built (what transformers' config reader reads in milliseconds, not seconds)."""
    if source.kind is not SourceKind.GGUF:
        yield None
        return
    scratch = _temporary_folder(dest)
    try:
        yield write_header_copy(source.path, scratch / source.path.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    family: Family,
    entries: list[Entry],
    model_id: ModelId,
) -> Manifest:
    layer_params = family.layer_params
    if source.kind is SourceKind.GGUF and family.gguf_layer_params is not None:
        layer_params = family.gguf_layer_params
    layout = layout_from_config(config, family.paths, layer_params)
    parts: dict[str, dict[str, Entry]] = {}
    for entry in entries:
        where = split_name(entry.hf_name, family.paths)
        if where is None:
            continue  # e.g. GGUF's rope_freqs: recomputed from the config
        part, name = where
        if part.startswith("layer-"):
            name = family.part_name(name)
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


def _record(part: str, entries: dict[str, Entry]) -> PartRecord:
    return PartRecord(
        file=part_file(part),
        params={name: e.shape for name, e in entries.items()},
        quant={name: e.qtype for name, e in entries.items() if e.qtype is not None},
        keys={name: e.key for name, e in entries.items()},
        nbytes=sum(e.nbytes for e in entries.values()),
    )


def _read_config_and_tokenizer(source: ModelSource, header: HeaderCopy | None) -> tuple[Any, Any]:
    """The config, and the tokenizer: transformers' for a folder, a GGUF file's own
    fields for a GGUF file (transformers' conversion of those gives other ids than
    llama.cpp's, and takes half a minute for a large vocabulary). A GGUF file's config is
    read from `header`, its copy without the vocabulary's arrays."""
    from transformers import AutoConfig, AutoTokenizer

    if header is not None:
        where, kwargs = str(header.path.parent), {"gguf_file": header.path.name}
        fields = read_tokenizer_fields(source.path)
        if not has_tokenizer(fields):
            raise CorruptModelError(
                f"{source.name}: the GGUF file has no tokenizer (no tokenizer.ggml.model)"
            )
        tokenizer: Any = fields
    else:
        where, kwargs, tokenizer = str(source.path), {}, None
    try:
        config = None if header is None else own_gguf_config(header.path)
        if config is None:
            config = AutoConfig.from_pretrained(where, **kwargs)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError) as e:
        raise CorruptModelError(
            f"{source.name}: cannot read the model's config or tokenizer: {e}"
        ) from None
    if header is not None and not header.has_vocab_size and header.vocabulary_entries:
        # transformers counts the tokens where the metadata has no vocab_size; the copy has none
        config.vocab_size = header.vocabulary_entries
    # The cache's config describes plain tensors; the GGUF note would mislead later loads.
    if hasattr(config, "quantization_config"):
        if source.kind is not SourceKind.GGUF:
            family_for(config)  # a family may refuse a folder of quantized weights
        del config.quantization_config
    return config, tokenizer


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
        except (OSError, SafetensorError) as e:  # safetensors' own error for a full disk
            tmp.unlink(missing_ok=True)
            raise CacheWriteError(f"cannot write {path}: {e}") from None

    def _gguf_part(self, record: PartRecord) -> dict[str, torch.Tensor]:
        path = self.source.path
        if self._table is None:
            self._table = read_table(path)
        tensor_processor = processor(self.config, self._table.architecture)
        out = {}
        experts = gguf_experts.Slicer(self._table)  # reads each 3-D tensor once
        for name, key in record.keys.items():
            if experts.owns(key):
                out[name] = experts.slice(key)
                continue
            if key not in self._table.tensors:
                raise CorruptModelError(f"{path}: tensor {key} is gone; the file changed")
            raw = self._table.read(key)
            # the processor's row permutation (e.g. Llama's q/k) commutes with row-wise blocks
            result = tensor_processor.process(
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
        file, _, inner = key.partition(KEY_SEPARATOR)
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
