"""Request bodies of OpenAI's /v1/embeddings and Ollama's /api/embed and /api/embeddings into
an EmbeddingRequest, and the vectors into their answers. Every field a client may send is
honoured or refused with a 400 that names it."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from swarm.api.backend import Backend, EmbeddingRequest, Embeddings
from swarm.api.errors import bad_request
from swarm.api.fields import check_served_model
from swarm.api.ollama_fields import check_model

MAX_INPUTS = 2048  # inputs of one request, as OpenAI bounds them
_OPENAI_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})
_OLLAMA_FIELDS = frozenset({"input", "model", "truncate", "options", "keep_alive", "dimensions"})
_OLLAMA_OLD_FIELDS = frozenset({"prompt", "model", "options", "keep_alive"})

Encoding = Literal["float", "base64"]


@dataclass(frozen=True)
class ParsedEmbeddings:
    request: EmbeddingRequest
    encoding: Encoding  # how each vector is written: a list of numbers, or base64 float32
    model: str  # as the answer names it


def parse_openai(body: dict[str, Any], backend: Backend) -> ParsedEmbeddings:
    """The request, or an ApiError naming the bad field."""
    _refuse_unknown(body, _OPENAI_FIELDS)
    check_served_model(body)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request('encoding_format must be "float" or "base64"', "encoding_format")
    _dimensions(body, backend.embedding_size)
    inputs = read_inputs(body.get("input"), "input")
    return ParsedEmbeddings(EmbeddingRequest(inputs), encoding, backend.model_name)


def parse_ollama(body: dict[str, Any], backend: Backend) -> ParsedEmbeddings:
    """/api/embed: `input` a string or a list of them; `truncate` (true by default) cuts an
    input longer than the context to it; options and keep_alive change nothing here."""
    _refuse_unknown(body, _OLLAMA_FIELDS)
    model = check_model(body)
    _dimensions(body, backend.embedding_size)
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise bad_request("truncate must be true or false", "truncate")
    inputs = read_inputs(body.get("input"), "input", texts_only=True)
    return ParsedEmbeddings(EmbeddingRequest(inputs, truncate=truncate), "float", model)


def parse_ollama_old(body: dict[str, Any], backend: Backend) -> ParsedEmbeddings:
    """/api/embeddings, Ollama's older route: one `prompt`, its vector as pooled (Ollama
    returns this one without making it unit length)."""
    _refuse_unknown(body, _OLLAMA_OLD_FIELDS)
    model = check_model(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string", "prompt")
    return ParsedEmbeddings(EmbeddingRequest((prompt,), normalize=False), "float", model)


def read_inputs(
    value: Any, name: str, texts_only: bool = False
) -> tuple[str | tuple[int, ...], ...]:
    """A string, a list of strings, a list of token ids (one input), or a list of lists of
    token ids; none of them empty, at most MAX_INPUTS."""
    ids = "" if texts_only else ", a list of token ids or a list of such lists"
    shape = f"{name} must be a string, a list of strings{ids}"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise bad_request(shape, name)
    if not value:
        raise bad_request(f"{name} is empty: give at least one text", name)
    if not texts_only and all(_token(v) for v in value):
        return (tuple(value),)
    if len(value) > MAX_INPUTS:
        raise bad_request(f"{name} holds {len(value)} inputs; at most {MAX_INPUTS} a request", name)
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, str):
            raise bad_request(f"{name}[{i}] is an empty string", f"{name}[{i}]")
        elif not texts_only and isinstance(item, list) and item and all(map(_token, item)):
            out.append(tuple(item))
        elif not texts_only and isinstance(item, list) and not item:
            raise bad_request(f"{name}[{i}] is an empty list of token ids", f"{name}[{i}]")
        else:
            raise bad_request(shape, f"{name}[{i}]")
    return tuple(out)


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dimensions(body: dict[str, Any], width: int) -> None:
    """The model's width is its own: `dimensions` may only name it."""
    asked = body.get("dimensions")
    if asked is not None and asked != width:
        raise bad_request(
            f"dimensions must be {width}, this model's embedding width: it cannot be changed",
            "dimensions",
        )


def _refuse_unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    for name in body:
        if name not in known:
            raise bad_request(f"unknown field {name!r}", name)


def encoded(vector: Sequence[float], encoding: Encoding) -> list[float] | str:
    """A vector as OpenAI writes it: numbers, or base64 of little-endian float32."""
    if encoding == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def openai_answer(parsed: ParsedEmbeddings, done: Embeddings) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": encoded(v, parsed.encoding)}
        for i, v in enumerate(done.vectors)
    ]
    usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
    return {"object": "list", "data": data, "model": parsed.model, "usage": usage}
