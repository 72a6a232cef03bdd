"""The manifest of a per-layer cache: the model's identity, what every part file holds and
where each of its tensors lies in the checkpoint (parts are filled lazily, see convert.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.errors import CorruptModelError
from swarm.types import ModelId

FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class PartRecord:
    file: str
    params: dict[str, tuple[int, ...]]  # name -> the Hugging Face shape
    quant: dict[str, str]  # name -> GGUF block type; absent names are float tensors
    keys: dict[str, str]  # name -> where it lies in the checkpoint
    nbytes: int  # bytes of the part's tensors as stored (quantized blocks stay packed)


@dataclass(frozen=True)
class Manifest:
    model_id: ModelId  # sha256 of the source checkpoint's bytes
    source: str
    model_type: str
    num_layers: int
    hidden_size: int
    tie_word_embeddings: bool
    parts: dict[str, PartRecord]

    def to_json(self) -> str:
        body = {
            "format_version": FORMAT_VERSION,
            "model_id": self.model_id,
            "source": self.source,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "parts": {
                name: {
                    "file": p.file,
                    "params": {k: list(v) for k, v in p.params.items()},
                    "quant": p.quant,
                    "keys": p.keys,
                    "nbytes": p.nbytes,
                }
                for name, p in self.parts.items()
            },
        }
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST_FILE
        try:
            body = json.loads(path.read_text())
            if body.get("format_version") != FORMAT_VERSION:
                raise ValueError(
                    f"format_version {body.get('format_version')!r} != {FORMAT_VERSION}"
                )
            return cls(
                model_id=ModelId(str(body["model_id"])),
                source=str(body["source"]),
                model_type=str(body["model_type"]),
                num_layers=int(body["num_layers"]),
                hidden_size=int(body["hidden_size"]),
                tie_word_embeddings=bool(body["tie_word_embeddings"]),
                parts={name: _part(p) for name, p in body["parts"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptModelError(
                f"model cache {folder} has an unreadable manifest ({e}); "
                "delete the folder to convert again"
            ) from None


def _part(raw: Any) -> PartRecord:
    return PartRecord(
        file=str(raw["file"]),
        params={str(k): tuple(int(d) for d in v) for k, v in raw["params"].items()},
        quant={str(k): str(v) for k, v in raw["quant"].items()},
        keys={str(k): str(v) for k, v in raw["keys"].items()},
        nbytes=int(raw["nbytes"]),
    )


CHUNK_BYTES = 1 << 20  # a part travels and is verified in pieces of this many bytes
DIGEST_SUFFIX = ".chunks"  # beside a part file: its PartDigest, written when it is stored


@dataclass(frozen=True)
class PartDigest:
    """What a stored part file must hash to, whole and per chunk, so a receiver checks each
    chunk as it arrives and refetches only a bad one."""

    size: int  # bytes of the part file
    sha256: str  # of the whole file
    chunks: tuple[str, ...]  # sha256 of each CHUNK_BYTES piece, the last one shorter

    @classmethod
    def of(cls, data: bytes) -> PartDigest:
        pieces = range(0, max(len(data), 1), CHUNK_BYTES)
        return cls(
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            chunks=tuple(hashlib.sha256(data[i : i + CHUNK_BYTES]).hexdigest() for i in pieces),
        )

    def chunk_range(self, index: int) -> tuple[int, int]:
        """[start, end) of chunk `index` in the file."""
        start = index * CHUNK_BYTES
        return start, min(start + CHUNK_BYTES, self.size)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256, "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, raw: Any) -> PartDigest:
        """Raises CorruptModelError for anything malformed (it may come from a peer)."""
        try:
            digest = cls(
                size=int(raw["size"]),
                sha256=str(raw["sha256"]),
                chunks=tuple(str(c) for c in raw["chunks"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptModelError(f"malformed part digest: {e}") from None
        if digest.size < 0 or len(digest.chunks) != max(1, -(-digest.size // CHUNK_BYTES)):
            raise CorruptModelError("a part digest's chunks do not fit its size")
        return digest
