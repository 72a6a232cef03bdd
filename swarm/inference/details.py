"""What the API says about the model it serves (`ModelDetails`), read once from the model's
manifest, config and tokenizer at the entry."""

from __future__ import annotations

import math
import time
from collections import Counter

from swarm.runtime.checkpoint.gguf_metadata import VOCAB_FILE
from swarm.runtime.checkpoint.manifest import Manifest
from swarm.runtime.execution.entry import EntryModel
from swarm.schema import ModelDetails

# GGUF's names for float types, as Ollama's quantization_level shows an unquantized model
_FLOAT_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def model_details(name: str, entry: EntryModel, context_tokens: int) -> ModelDetails:
    context = entry.context
    manifest = context.store.manifest
    config = context.config
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "")
    dtype = dtype.removeprefix("torch.")
    return ModelDetails(
        name=name,
        family=manifest.model_type,
        # a GGUF file's cache keeps its tokenizer's fields (a Hugging Face folder's, its files)
        format="gguf" if (context.store.tokenizer_folder / VOCAB_FILE).is_file() else "safetensors",
        parameters=sum(
            math.prod(shape) for p in manifest.parts.values() for shape in p.params.values()
        ),
        size_bytes=sum(p.nbytes for p in manifest.parts.values()),
        quantization=quantization(manifest) or _FLOAT_NAMES.get(dtype, dtype.upper()),
        digest=manifest.model_id,
        context_tokens=context_tokens,
        layers=manifest.num_layers,
        hidden_size=manifest.hidden_size,
        chat_template=entry.tokenizer.chat_template or "",
        loaded_unix=time.time(),
    )


def quantization(manifest: Manifest) -> str:
    """The GGUF block type that holds the most weights; empty where none is quantized."""
    weights: Counter[str] = Counter()
    for part in manifest.parts.values():
        for tensor, kind in part.quant.items():
            weights[kind] += math.prod(part.params[tensor])
    return weights.most_common(1)[0][0] if weights else ""
