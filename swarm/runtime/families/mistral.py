"""Mistral: Llama's layer; one sliding window (or none) for every layer.

A Mistral GGUF is a llama-architecture file: llama.cpp runs it with full attention, and
transformers reads it as a Llama config, so the llama adapter serves it."""

from __future__ import annotations

from swarm.runtime.families.family import Family, every_layer_windowed
from swarm.runtime.families.llama import lean_or_hf_block

FAMILY = Family(
    name="mistral",
    model_types=("mistral",),
    gguf_architectures=(),
    block=lean_or_hf_block,
    attention=every_layer_windowed,
)
