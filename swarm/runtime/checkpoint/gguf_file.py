"""A GGUF file's tensor table, and single tensors read by offset.

The `gguf` package's reader turns every metadata value into numpy views (a 49k-token
vocabulary becomes ~400k objects, seconds to build and hundreds of MB held) and maps the whole
file; a node that reads a few layers needs neither. This parser skips the metadata, keeps the
tensor table, checks that every tensor lies within the file (a truncated download fails here),
and reads one tensor's bytes with a plain seek and read."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.errors import CorruptModelError

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# metadata value type -> fixed size in bytes (8: string and 9: array are variable)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str  # GGML type name: F32, Q4_K, ...
    shape: tuple[int, ...]  # GGUF order: the innermost (row length) first
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFTable:
    path: Path
    tensors: dict[str, TensorInfo]
    data_offset: int  # where tensor data starts: everything before is metadata and table
    architecture: str  # general.architecture: llama, qwen2, gemma2, ...

    def read(self, name: str) -> np.ndarray:
        """One tensor as stored: uint8 [rows, row_bytes] for blocks, else its float array
        in Hugging Face order (bfloat16 as raw uint16)."""
        info = self.tensors[name]
        with self.path.open("rb") as f:
            f.seek(info.offset)
            data = f.read(info.nbytes)
        if len(data) != info.nbytes:
            raise CorruptModelError(f"{self.path}: tensor {name} is cut short")
        rows = tuple(reversed(info.shape))
        if info.qtype in _FLOATS:
            return np.frombuffer(data, dtype=_FLOATS[info.qtype]).reshape(rows).copy()
        row_count = int(np.prod(rows[:-1])) if len(rows) > 1 else 1
        return np.frombuffer(data, dtype=np.uint8).reshape(row_count, -1).copy()


_FLOATS = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_table(path: Path) -> GGUFTable:
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(path, m, len(m))
    except (OSError, ValueError, struct.error, UnicodeDecodeError, IndexError) as e:
        raise CorruptModelError(f"{path}: truncated or corrupt GGUF file: {e}") from None


def table_from_head(path: Path, head: bytes, size: int) -> GGUFTable | None:
    """The table of a GGUF file of `size` bytes from its first bytes (the start of a download),
    or None while `head` ends before the table does."""
    if head[:4] != _MAGIC[: len(head)]:
        raise CorruptModelError(f"{path}: not a GGUF file")
    try:
        return _parse(path, head, size)
    except (ValueError, struct.error, UnicodeDecodeError, IndexError):
        if len(head) >= size:
            raise CorruptModelError(f"{path}: not a readable GGUF file") from None
        return None


@dataclass(frozen=True)
class _MetadataEntry:
    """One metadata key as it lies in the file: its bytes are m[start:end]."""

    key: str
    vtype: int
    value_at: int
    start: int
    end: int


@dataclass(frozen=True)
class _Layout:
    """Where a GGUF file's parts lie: the metadata's entries, the tensor table, the data."""

    n_tensors: int
    entries: list[_MetadataEntry]
    table: list[tuple[str, int, tuple[int, ...], int]]  # name, type, GGUF shape, data offset
    table_span: tuple[int, int]
    alignment: int  # of the data's start
    data_offset: int
    architecture: str


def _layout(m: mmap.mmap | bytes) -> _Layout:
    if m[:4] != _MAGIC:
        raise ValueError("no GGUF magic number")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    pos, alignment, architecture = 24, _DEFAULT_ALIGNMENT, ""
    entries = []
    for _ in range(n_kv):
        start = pos
        key, pos = _string(m, pos)
        (vtype,) = struct.unpack_from("<I", m, pos)
        value_at = pos + 4
        if key == "general.alignment" and vtype == _UINT32:
            (alignment,) = struct.unpack_from("<I", m, value_at)
        if key == "general.architecture" and vtype == _STRING:
            architecture = _string(m, value_at)[0]
        pos = _skip_value(m, value_at, vtype)
        entries.append(_MetadataEntry(key, vtype, value_at, start, pos))
    table_start, table = pos, []
    for _ in range(n_tensors):
        name, pos = _string(m, pos)
        (dims,) = struct.unpack_from("<I", m, pos)
        shape = struct.unpack_from(f"<{dims}Q", m, pos + 4)
        kind, offset = struct.unpack_from("<IQ", m, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        table.append((name, kind, tuple(int(d) for d in shape), offset))
    data_offset = -(-pos // alignment) * alignment
    return _Layout(
        n_tensors, entries, table, (table_start, pos), alignment, data_offset, architecture
    )


def _parse(path: Path, m: mmap.mmap | bytes, size: int) -> GGUFTable:
    from gguf import GGMLQuantizationType

    layout = _layout(m)
    tensors = {}
    for name, kind, shape, offset in layout.table:
        nbytes = _tensor_bytes(kind, shape)
        start = layout.data_offset + offset
        if start + nbytes > size:
            raise CorruptModelError(
                f"{path}: truncated GGUF file: tensor {name} ends at byte {start + nbytes}, "
                f"the file has {size}"
            )
        tensors[name] = TensorInfo(name, GGMLQuantizationType(kind).name, shape, start, nbytes)
    return GGUFTable(path, tensors, layout.data_offset, layout.architecture)


def _string(m: mmap.mmap | bytes, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", m, pos)
    end = pos + 8 + length
    if end > len(m):
        raise ValueError("a string runs past the end of the file")
    return m[pos + 8 : end].decode(), end


def _skip_value(m: mmap.mmap | bytes, pos: int, vtype: int) -> int:
    if vtype in _FIXED:
        return pos + _FIXED[vtype]
    if vtype == _STRING:
        return _string(m, pos)[1]
    if vtype == _ARRAY:
        item, count = struct.unpack_from("<IQ", m, pos)
        pos += 12
        if item in _FIXED:
            return pos + _FIXED[item] * int(count)
        for _ in range(count):
            pos = _skip_value(m, pos, item)
        return pos
    raise ValueError(f"unknown metadata value type {vtype}")


# The tokenizer's arrays: the `gguf` package's reader turns each entry into numpy views, which
# takes seconds for a 150k-entry vocabulary (a minute for Gemma 3's 262k on a busy machine);
# a model's config needs none of them. swarm reads them itself (gguf_metadata).
_VOCABULARY_ARRAYS = frozenset(
    {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    | {"tokenizer.ggml.merges"}
)
# tensors outside the layers that are at most this big keep their bytes in the copy: the rope
# factors, which a family's config reads
_SMALL_TENSOR_BYTES = 1 << 20


@dataclass(frozen=True)
class HeaderCopy:
    """A GGUF file with another's metadata and tensor table but not its vocabulary's arrays."""

    path: Path
    vocabulary_entries: int | None  # the tokens array's length; None without one
    has_vocab_size: bool  # the metadata names `<architecture>.vocab_size` itself


def write_header_copy(source: Path, dest: Path) -> HeaderCopy:
    """Write at `dest` what `gguf.GGUFReader` (and transformers' config reader on top of it)
    needs to describe `source`'s model, readable in milliseconds: every metadata key but the
    vocabulary's arrays, the whole tensor table, the bytes of the small tensors, and a hole
    of the same size where the large ones lie (a sparse file: nothing of them is written)."""
    try:
        with source.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _write_header_copy(m, len(m), dest)
    except (ValueError, struct.error, UnicodeDecodeError, IndexError) as e:
        raise CorruptModelError(f"{source}: truncated or corrupt GGUF file: {e}") from None


def _write_header_copy(m: mmap.mmap, size: int, dest: Path) -> HeaderCopy:
    layout = _layout(m)
    kept = [m[e.start : e.end] for e in layout.entries if e.key not in _VOCABULARY_ARRAYS]
    tokens = [e for e in layout.entries if e.key == "tokenizer.ggml.tokens" and e.vtype == _ARRAY]
    count = int(struct.unpack_from("<IQ", m, tokens[0].value_at)[1]) if tokens else None
    vocab_size = f"{layout.architecture}.vocab_size"
    has_vocab_size = any(e.key == vocab_size for e in layout.entries)
    if count is not None and not has_vocab_size:  # what transformers would count instead
        kept.append(_uint32_entry(vocab_size, count))
    table = m[layout.table_span[0] : layout.table_span[1]]
    header = b"".join([m[:8], struct.pack("<QQ", layout.n_tensors, len(kept)), *kept, table])
    copy_offset = -(-len(header) // layout.alignment) * layout.alignment
    with dest.open("wb") as out:
        out.write(header)
        for name, kind, shape, offset in layout.table:
            nbytes = _tensor_bytes(kind, shape)
            if not name.startswith("blk.") and nbytes <= _SMALL_TENSOR_BYTES:
                out.seek(copy_offset + offset)
                out.write(m[layout.data_offset + offset : layout.data_offset + offset + nbytes])
        out.truncate(copy_offset + size - layout.data_offset)
    return HeaderCopy(dest, count, has_vocab_size)


def _uint32_entry(key: str, value: int) -> bytes:
    name = key.encode()
    return struct.pack(f"<Q{len(name)}sII", len(name), name, _UINT32, value)


def _tensor_bytes(kind: int, shape: tuple[int, ...]) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    return int(np.prod(shape)) // block * type_size
