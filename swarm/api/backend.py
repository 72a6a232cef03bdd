"""What the HTTP layer needs from a node, in its own terms."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from swarm.sampling_settings import SamplingSettings
from swarm.schema import ModelDetails, RequestTrace


@dataclass(frozen=True)
class GenerationRequest:
    # chat: OpenAI's messages ({"role", "content"}, tool_calls, tool_call_id), else None
    messages: Sequence[dict[str, Any]] | None
    prompt: str | None  # completions: raw text, else None
    sampling: SamplingSettings  # checked where the request was read
    tools: tuple[dict[str, Any], ...] | None = None  # OpenAI's tool definitions, to render


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model (before any sampling setting),
    with the likeliest tokens at its position, best first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        """OpenAI's chat shape, which Ollama's answers share."""

        def one(token: str, logprob: float) -> dict[str, Any]:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {**one(self.token, self.logprob), "top_logprobs": [one(t, p) for t, p in self.top]}


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens behind this delta, where asked


@dataclass(frozen=True)
class Done:
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    trace: RequestTrace | None = None  # route and per-hop timings, where the backend has them
    cached_tokens: int = 0  # prompt tokens that came from blocks the hops kept
    stop_sequence: str | None = None  # the stop string that ended the text, where one did


class Generation(Protocol):
    """One request, its prompt already tokenized and checked."""

    @property
    def prompt_tokens(self) -> int: ...

    def events(self) -> AsyncGenerator[TextDelta | Done, None]:
        """Stream the answer. Closing the generator early (aclose) ends the request and frees
        its caches on every hop."""
        ...


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: tuple[str | tuple[int, ...], ...]  # texts, or token ids as they are; never empty
    truncate: bool = False  # an input longer than the context is cut to it, not refused
    normalize: bool = True  # unit length (Ollama's older /api/embeddings: as pooled)


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]  # one per input, in order, each `embedding_size` wide
    prompt_tokens: int  # of every input together


@dataclass(frozen=True)
class Health:
    """Whether this node can serve a request now: what GET /health answers."""

    ready: bool
    reason: str = ""  # why not, in a sentence; empty when ready
    missing: tuple[tuple[int, int], ...] = ()  # layer spans no live node serves


class Backend(Protocol):
    model_name: str  # what clients name in `model`

    @property
    def context_tokens(self) -> int:
        """The model's context: prompt and answer together, in tokens."""
        ...

    @property
    def details(self) -> ModelDetails:
        """What the model is: family, size, quantization, template."""
        ...

    async def start(self, request: GenerationRequest) -> Generation:
        """Tokenize and check the request once; raises SwarmError subclasses for bad input or
        a node that takes no new requests."""
        ...

    @property
    def embedding_size(self) -> int:
        """The width of an embedding: the model's hidden size."""
        ...

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """Every input's embedding; raises SwarmError subclasses as `start` does (an input
        that is empty, outside the vocabulary or longer than the context: SamplingError
        naming `input`)."""
        ...

    @property
    def accepting(self) -> bool:
        """False once the node is leaving: it takes no new requests."""
        ...
