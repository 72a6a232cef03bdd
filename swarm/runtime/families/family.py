"""What a model family is to the runtime: the few facts and hooks that differ between
Llama, Qwen, Gemma, Mistral and Phi checkpoints. Everything outside a family module reads a
checkpoint through one of these, so the rest of the runtime stays family-agnostic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from swarm.errors import ModelError, UnsupportedModelError
from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.weights.packed import Source

FULL = "full_attention"  # transformers' layer type names, reused as rotary table keys
SLIDING = "sliding_attention"


class Block(Protocol):
    """One decoder layer with its weights loaded."""

    def __call__(
        self,
        hidden: torch.Tensor,  # [batch, seq, hidden]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [batch, seq, head_dim]
        attention_mask: torch.Tensor | None,  # bool [batch, 1, seq, kv_len], True = attend
        cache: SessionKV,
    ) -> torch.Tensor: ...


@runtime_checkable
class BatchedBlock(Block, Protocol):
    """A decoder layer that also runs decode positions of several sessions in one call."""

    def decode_batch(
        self,
        hidden: torch.Tensor,  # [rows, 1, hidden]: each row a position of its own session
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin per row
        caches: list[SessionKV],  # each row's session's cache, rows of a session together
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionKind:
    """How one layer attends: which earlier positions it sees and which rotary table it uses."""

    window: int | None  # a query sees this many positions, itself included; None: all before it
    rope: str = "default"  # key of the rotary table (transformers' layer type, or "default")


@dataclass(frozen=True)
class SkeletonPaths:
    """Where the parts live in transformers' module tree for the family's ForCausalLM."""

    embedding: str = "model.embed_tokens"
    layers: str = "model.layers"
    norm: str = "model.norm"
    head: str = "lm_head"
    rotary: str = "model.rotary_emb"

    def layer(self, skeleton: torch.nn.Module, index: int) -> torch.nn.Module:
        """Decoder layer `index` of the skeleton."""
        layers = skeleton.get_submodule(self.layers)
        if not isinstance(layers, torch.nn.ModuleList):
            raise ModelError(f"{self.layers} is not a list of decoder layers in this model")
        return layers[index]


# (config, the skeleton's decoder layer `index` on the meta device, index, weights, int8)
BlockBuilder = Callable[[Any, torch.nn.Module, int, dict[str, Source], bool], Block]
GGUFHook = Callable[[Any, Any], None]  # (config, gguf reader): fix the config from the file
Shapes = dict[str, tuple[int, ...]]  # parameter name -> shape, inside one part


def _no_gguf_fixes(config: Any, reader: Any) -> None:
    return None


@dataclass(frozen=True)
class Family:
    """One registration. The defaults describe a Llama-shaped decoder; a family overrides
    only what it does differently."""

    name: str  # for messages and the README table
    model_types: tuple[str, ...]  # transformers' config.model_type values it serves
    gguf_architectures: tuple[str, ...]  # GGUF general.architecture values it reads
    block: BlockBuilder  # a decoder layer with its weights
    rope_types: frozenset[str] = frozenset({"default"})  # rotary scalings it is tested with
    paths: SkeletonPaths = field(default_factory=SkeletonPaths)
    # the embedding output is multiplied by this (Gemma: sqrt(hidden_size), in the model dtype)
    embed_scale: Callable[[Any], float | None] = lambda config: None
    # logits = cap * tanh(logits / cap) (Gemma-2)
    logit_softcap: Callable[[Any], float | None] = lambda config: None
    attention: Callable[[Any, int], AttentionKind] = lambda config, index: AttentionKind(None)
    # "sdpa" unless the layer needs what SDPA lacks (Gemma-2's attention soft-capping)
    attn_implementation: Callable[[Any], str] = lambda config: "sdpa"
    # Gemma-3: one rotary table per layer type, the rotary module takes the type as argument
    rotary_per_layer_type: bool = False
    # adjusts transformers' rotary module after it is built (Llama-3 GGUF frequency factors)
    rotary_hook: Callable[[Any, torch.nn.Module], None] = lambda config, module: None
    gguf_config: GGUFHook = _no_gguf_fixes
    # GGUF rope scaling types (`<arch>.rope.scaling.type`) that gguf_config carries over;
    # transformers' GGUF reader drops them all, so any other is refused rather than lost
    gguf_rope_scalings: frozenset[str] = frozenset()
    check: Callable[[Any], None] = lambda config: None  # raise UnsupportedModelError
    # a layer part's parameters from the skeleton's (mixture of experts: a matrix per expert)
    layer_params: Callable[[Any, Shapes], Shapes] = lambda config, shapes: shapes
    # the same from a GGUF file, where its layer is laid out otherwise (gpt-oss); None: as above
    gguf_layer_params: Callable[[Any, Shapes], Shapes] | None = None
    # a checkpoint's parameter name inside a layer, as the part stores it (Mixtral's w1, w2, w3)
    part_name: Callable[[str], str] = lambda name: name

    def validate(self, config: Any) -> None:
        """Refuse, in one line, a checkpoint using a feature this adapter does not implement."""
        rope = getattr(config, "rope_parameters", None) or {}
        tables = rope.values() if all(isinstance(v, dict) for v in rope.values()) else [rope]
        for table in tables:
            rope_type = (table or {}).get("rope_type", "default")
            if rope_type not in self.rope_types:
                raise UnsupportedModelError(
                    f"model type {config.model_type!r} with rope type {rope_type!r} is not "
                    f"supported: the {self.name} adapter implements rope types "
                    f"{', '.join(sorted(self.rope_types))}"
                )
        self.check(config)

    def read_gguf(self, config: Any, reader: Any) -> None:
        """Complete the config transformers built from a GGUF file, or refuse the file."""
        architecture = str(gguf_field(reader, "general.architecture"))
        if architecture not in self.gguf_architectures:
            raise UnsupportedModelError(
                f"model type {config.model_type!r} from a GGUF file of architecture "
                f"{architecture!r} is not supported; the {self.name} adapter reads "
                f"{', '.join(self.gguf_architectures) or 'no GGUF files'}"
            )
        scaling = gguf_field(reader, f"{architecture}.rope.scaling.type")
        if scaling not in (None, "none") and scaling not in self.gguf_rope_scalings:
            raise UnsupportedModelError(
                f"model type {config.model_type!r}: GGUF rope scaling {scaling!r} is not "
                f"supported; the {self.name} adapter reads "
                f"{', '.join(sorted(self.gguf_rope_scalings)) or 'none'}"
            )
        pooling = gguf_field(reader, f"{architecture}.pooling_type")
        if pooling is not None:  # an embedding model's: how its embeddings are pooled
            config.gguf_pooling_type = int(pooling)
        self.gguf_config(config, reader)


def layer_types_attention(config: Any, index: int) -> AttentionKind:
    """Attention from transformers' `layer_types` list and `sliding_window`."""
    types = getattr(config, "layer_types", None)
    kind = types[index] if types else FULL
    window = getattr(config, "sliding_window", None)
    if kind == SLIDING and window:
        return AttentionKind(int(window), SLIDING)
    if kind not in (FULL, SLIDING):
        raise UnsupportedModelError(
            f"model type {config.model_type!r}: layer {index} has attention type {kind!r}; "
            f"supported are {FULL} and {SLIDING}"
        )
    return AttentionKind(None, FULL)


def every_layer_windowed(config: Any, index: int) -> AttentionKind:
    """Mistral and Phi-3: one `sliding_window` (or none) for every layer."""
    window = getattr(config, "sliding_window", None)
    return AttentionKind(int(window) if window else None)


def gguf_field(reader: Any, key: str) -> Any:
    """A scalar metadata value of a GGUF file, or None when absent."""
    found = reader.fields.get(key)
    if found is None:
        return None
    return found.contents()


def gguf_tensor(reader: Any, name: str) -> Any:
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor
    return None
