"""What a checkpoint's headers say each tensor is (`Entry`): a GGUF file's tensor table, mapped
to Hugging Face names (a family's experts cut per expert, `gguf_experts`), or a folder's
safetensors headers; and the GGUF config a family builds itself where transformers' reader
fails. Nothing here reads tensor data."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarm.errors import CorruptModelError
from swarm.runtime.checkpoint import gguf_experts
from swarm.runtime.checkpoint.gguf_file import GGUFTable, read_table
from swarm.runtime.checkpoint.layout import build_skeleton
from swarm.runtime.families import GGUF_CONFIGS, SkeletonPaths
from swarm.runtime.weights import ggml

KEY_SEPARATOR = "::"  # safetensors source keys: "<file>::<tensor name>"


@dataclass(frozen=True)
class Entry:
    """One checkpoint tensor as its header describes it."""

    hf_name: str
    key: str  # where it lies: GGUF tensor name, or "<file>::<name>" in a folder
    shape: tuple[int, ...]  # the Hugging Face shape
    qtype: str | None  # GGUF block type, None for float tensors
    nbytes: int


def own_gguf_config(path: Path) -> Any:
    """The config of the GGUF file at `path` where its architecture is one transformers'
    reader gets wrong, built by its family from the file's fields; None for every other."""
    architecture = read_table(path).architecture
    if architecture not in GGUF_CONFIGS:
        return None
    return GGUF_CONFIGS[architecture](gguf_reader(path))


def gguf_entries(reader: GGUFTable, config: Any, paths: SkeletonPaths) -> Iterator[Entry]:
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    tensor_processor = processor(config, reader.architecture)
    name_map = get_gguf_hf_weights_map(
        build_skeleton(config), tensor_processor, model_type=reader.architecture
    )
    for tensor in reader.tensors.values():
        if gguf_experts.is_experts(tensor.name):
            for hf_name, key, shape, nbytes in gguf_experts.entries(tensor, paths.layers):
                yield Entry(hf_name, key, shape, _block_type(tensor.qtype), nbytes)
            continue
        # a bare parameter (gpt-oss's attention sinks) is mapped without llama.cpp's ".weight"
        hf_name = name_map.get(tensor.name) or name_map.get(tensor.name.removesuffix(".weight"))
        if hf_name is None:
            continue
        yield Entry(
            hf_name,
            tensor.name,
            tuple(reversed(tensor.shape)),
            _block_type(tensor.qtype),
            tensor.nbytes,
        )


def _block_type(qtype: str) -> str | None:
    return None if qtype in ggml.FLOAT_TYPES else qtype


def processor(config: Any, architecture: str) -> Any:
    """Keyed by the file's architecture, not transformers' model type: the processor undoes
    what llama.cpp did when writing this file (Llama's q/k row order, Gemma's norms + 1)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())


def gguf_reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CorruptModelError(f"{path}: not a readable GGUF file: {e}") from None


def folder_entries(folder: Path) -> Iterator[Entry]:
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    piece = f.get_slice(key)
                    shape = tuple(int(d) for d in piece.get_shape())
                    size = torch.empty((), dtype=_TORCH_DTYPES[piece.get_dtype()]).element_size()
                    yield Entry(
                        key,
                        f"{file.name}{KEY_SEPARATOR}{key}",
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
