"""A GGUF file's tokenizer fields (`tokenizer.*` and the few `general.*` keys a tokenizer reads),
and the file they are kept in inside the model cache.

The cache keeps them raw, as the GGUF file has them: what they mean (which pre-tokenizer a
`pre` name is, which tokens are control tokens) is `swarm.runtime.text`'s to decide, so a
change there never needs the cache rebuilt. The file travels to peers with the rest of the
index (`ModelStore.index_files`), so a node that fetched the model tokenizes as the node that
read the GGUF file.

The parser reads the metadata with plain struct reads, without the `gguf` package's reader:
that one builds numpy views of every value (seconds for a 150k-entry vocabulary)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from swarm.errors import CorruptModelError

VOCAB_FILE = "gguf_tokenizer.json"  # inside the cache's tokenizer folder
MODEL_KEY = "tokenizer.ggml.model"
# general.* keys llama.cpp's vocabulary reads (the name decides Phi-3's stripping rules)
_GENERAL_KEYS = ("general.name", "general.architecture")

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# scalar value type -> struct format
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}

Value = str | int | float | bool | list[Any]


def read_tokenizer_fields(path: Path) -> dict[str, Value]:
    """Every `tokenizer.*` key of the GGUF file at `path`, and general.name/architecture.
    Empty of tokenizer keys when the file carries no tokenizer."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(m)
    except (OSError, ValueError, struct.error, UnicodeDecodeError, IndexError) as e:
        raise CorruptModelError(f"{path}: unreadable GGUF metadata: {e}") from None


def has_tokenizer(fields: dict[str, Value]) -> bool:
    return MODEL_KEY in fields


def write_fields(folder: Path, fields: dict[str, Value]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    # surrogatepass: a token that is not valid UTF-8 was read with surrogateescape
    (folder / VOCAB_FILE).write_bytes(text.encode("utf-8", errors="surrogatepass"))


def read_fields(folder: Path) -> dict[str, Value] | None:
    """The fields kept in a cache's tokenizer folder; None when it holds a Hugging Face
    tokenizer instead."""
    path = folder / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_bytes().decode("utf-8", errors="surrogatepass"))
    except (OSError, ValueError) as e:
        raise CorruptModelError(f"{path}: unreadable tokenizer fields: {e}") from None
    if not isinstance(loaded, dict):
        raise CorruptModelError(f"{path}: tokenizer fields are not a JSON object")
    return loaded


def _parse(m: mmap.mmap) -> dict[str, Value]:
    if m[:4] != _MAGIC:
        raise ValueError("no GGUF magic number")
    version, _, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    pos = 24
    out: dict[str, Value] = {}
    for _ in range(n_kv):
        key, pos = _string(m, pos)
        (vtype,) = struct.unpack_from("<I", m, pos)
        wanted = key.startswith("tokenizer.") or key in _GENERAL_KEYS
        value, pos = _value(m, pos + 4, vtype, keep=wanted)
        if wanted:
            out[key] = value
    return out


def _value(m: mmap.mmap, pos: int, vtype: int, keep: bool) -> tuple[Value, int]:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        (value,) = struct.unpack_from(fmt, m, pos)
        return value, pos + struct.calcsize(fmt)
    if vtype == _STRING:
        return _string(m, pos)
    if vtype != _ARRAY:
        raise ValueError(f"unknown metadata value type {vtype}")
    item, count = struct.unpack_from("<IQ", m, pos)
    pos += 12
    if item in _NUMPY:
        dtype = np.dtype(_NUMPY[item]).newbyteorder("<")
        end = pos + dtype.itemsize * int(count)
        if end > len(m):
            raise ValueError("an array runs past the end of the file")
        values = (
            np.frombuffer(m, dtype=dtype, count=int(count), offset=pos).tolist() if keep else []
        )
        return values, end
    if item == _STRING:
        return _strings(m, pos, int(count), keep)
    items = []
    for _ in range(count):  # arrays of arrays: rare, and never a tokenizer's
        value, pos = _value(m, pos, item, keep)
        items.append(value)
    return items, pos


def _strings(m: mmap.mmap, pos: int, count: int, keep: bool) -> tuple[list[Any], int]:
    # the hot loop of a 150k-entry vocabulary: one length read and one slice per string
    out: list[Any] = []
    unpack, size = struct.unpack_from, len(m)
    for _ in range(count):
        (length,) = unpack("<Q", m, pos)
        end = pos + 8 + length
        if end > size:
            raise ValueError("a string runs past the end of the file")
        if keep:
            out.append(m[pos + 8 : end].decode("utf-8", errors="surrogateescape"))
        pos = end
    return out, pos


def _string(m: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", m, pos)
    end = pos + 8 + length
    if end > len(m):
        raise ValueError("a string runs past the end of the file")
    return m[pos + 8 : end].decode(), end
