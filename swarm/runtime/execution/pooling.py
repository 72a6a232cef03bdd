"""An embedding from a prompt's hidden states after the final norm, pooled as llama.cpp pools
them and made unit length as llama-server and Ollama return them.

A GGUF file may name its pooling (`<arch>.pooling_type`, llama.cpp's `llama_pooling_type`):
an embedding model's (Qwen3-Embedding: last; a mean-pooled one: mean) is honoured. A causal
language model names none, and then the last position's state is the embedding: the only
position that has seen the whole text, what Ollama returns for such a model (llama-server
asks for `--pooling` instead, and `--pooling last` gives the same)."""

from __future__ import annotations

from typing import Literal

import torch

from swarm.errors import UnsupportedModelError

Pooling = Literal["mean", "cls", "last"]

# llama_pooling_type's numbers: none (0), mean (1), cls (2), last (3), rank (4)
_GGUF: dict[int, Pooling] = {0: "last", 1: "mean", 2: "cls", 3: "last"}
_REFUSED = {4: "rank (a reranker's relevance score, not an embedding)"}


def pooling_of(gguf_value: object) -> Pooling:
    """The pooling for the file's `<arch>.pooling_type` (None: the file has none). "none"
    asks for every position's state, which an embedding API cannot return: the last
    position's, as where the file names none. UnsupportedModelError names a pooling this
    runtime does not do."""
    if gguf_value is None:
        return "last"
    if isinstance(gguf_value, int) and not isinstance(gguf_value, bool):
        if gguf_value in _GGUF:
            return _GGUF[gguf_value]
        if gguf_value in _REFUSED:
            raise UnsupportedModelError(
                f"the model's pooling type is {_REFUSED[gguf_value]}: not served as embeddings"
            )
    raise UnsupportedModelError(f"the model's pooling type {gguf_value!r} is not one swarm knows")


def every_row(pooling: Pooling) -> bool:
    """Whether the pooling reads every position's state, not only the last's."""
    return pooling != "last"


@torch.inference_mode()
def pool(normed: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """normed: [seq, hidden] float32 (every position's, or the last alone for "last") ->
    [hidden]."""
    if pooling == "mean":
        return normed.mean(dim=0)
    return normed[0] if pooling == "cls" else normed[-1]


@torch.inference_mode()
def unit(vector: torch.Tensor) -> torch.Tensor:
    """`vector` [hidden] float32 at unit length as llama.cpp's `common_embd_normalize` (its
    Euclidean case) makes it: the norm summed in double, one float32 scale; zero stays zero."""
    norm = float(vector.double().square().sum().sqrt())
    scale = 1.0 / norm if norm > 0.0 else 0.0
    return vector * torch.tensor(scale, dtype=torch.float32)
