"""Mistral: Llama's layer; one sliding window (or none) for every layer.

A Mistral GGUF is a llama-architecture file. transformers reads it as a Llama config (as a
Mistral one only when the file's name is exactly "mistral"); llama.cpp runs it with full
attention, since the file carries no window, and so does swarm either way."""

from __future__ import annotations

from typing import Any

from swarm.runtime.families.family import Family, every_layer_windowed
from swarm.runtime.families.llama import lean_or_hf_block


def _gguf_config(config: Any, reader: Any) -> None:
    config.sliding_window = None  # not the config class default: the file states none


FAMILY = Family(
    name="mistral",
    model_types=("mistral",),
    gguf_architectures=("llama",),
    block=lean_or_hf_block,
    attention=every_layer_windowed,
    gguf_config=_gguf_config,
)
