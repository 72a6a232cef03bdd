"""What the HTTP layer needs from a node, in its own terms."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class GenerationRequest:
    messages: Sequence[dict[str, str]] | None  # chat: [{"role", "content"}], else None
    prompt: str | None  # completions: raw text, else None
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Done:
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    trace: dict[str, Any] | None = None  # route and per-hop timings, where the backend has them


@dataclass(frozen=True)
class Health:
    """Whether this node can serve a request now: what GET /health answers."""

    ready: bool
    reason: str = ""  # why not, in a sentence; empty when ready
    missing: tuple[tuple[int, int], ...] = ()  # layer spans no live node serves


class Backend(Protocol):
    model_name: str

    def prompt_tokens(self, request: GenerationRequest) -> int:
        """Tokens of the prompt; raises SwarmError subclasses for bad input."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[TextDelta | Done, None]:
        """Stream the answer. Closing the generator early (aclose) ends the request and frees
        its caches on every hop."""
        ...

    def status(self) -> dict[str, Any]: ...

    def health(self) -> Health: ...
