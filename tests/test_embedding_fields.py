"""Embedding requests read into EmbeddingRequest, or refused with a 400 (or the model's 404)
naming the field; vectors written as OpenAI writes them; pooling as llama.cpp pools."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest
import torch

from swarm.api.embedding_fields import (
    MAX_INPUTS,
    encoded,
    parse_ollama,
    parse_ollama_old,
    parse_openai,
    read_inputs,
)
from swarm.api.errors import ApiError
from swarm.errors import UnsupportedModelError
from swarm.runtime.execution.pooling import every_row, pool, pooling_of, unit


class _Backend:
    model_name = "smol"
    embedding_size = 8


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hello", ("hello",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
        (["a", [4, 5]], ("a", (4, 5))),
    ],
    ids=["a string", "strings", "token ids", "lists of token ids", "both"],
)
def test_inputs_take_every_shape_openai_takes(value: Any, inputs: tuple[Any, ...]) -> None:
    assert read_inputs(value, "input") == inputs


@pytest.mark.parametrize(
    ("body", "status", "param", "fragment"),
    [
        ({}, 400, "input", "input must be a string"),
        ({"input": []}, 400, "input", "input is empty"),
        ({"input": ""}, 400, "input[0]", "input[0] is an empty string"),
        ({"input": ["a", ""]}, 400, "input[1]", "input[1] is an empty string"),
        ({"input": [[1], []]}, 400, "input[1]", "empty list of token ids"),
        ({"input": [1, -2]}, 400, "input[0]", "list of token ids"),
        ({"input": [True]}, 400, "input[0]", "input must be"),
        ({"input": {"text": "a"}}, 400, "input", "input must be"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, 400, "input", f"at most {MAX_INPUTS}"),
        ({"input": "a", "model": 9}, 400, "model", "model must be a string"),
        ({"input": "a", "dimensions": 4}, 400, "dimensions", "must be 8"),
        ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format", "base64"),
        ({"input": "a", "temperature": 1}, 400, "temperature", "unknown field"),
    ],
    ids=[
        "no input",
        "empty list",
        "empty string",
        "an empty string among others",
        "an empty token list",
        "a negative id",
        "a bool",
        "an object",
        "too many",
        "a model not a string",
        "other dimensions",
        "unknown encoding",
        "a chat field",
    ],
)
def test_bad_openai_bodies_are_refused_by_name(
    body: dict[str, Any], status: int, param: str, fragment: str
) -> None:
    with pytest.raises(ApiError) as e:
        parse_openai(body, _Backend())  # type: ignore[arg-type]
    assert (e.value.status, e.value.param) == (status, param)
    assert fragment in e.value.message


def test_an_openai_body_keeps_what_it_asks_and_drops_user() -> None:
    body = {"input": ["a"], "model": "smol", "encoding_format": "base64", "dimensions": 8}
    parsed = parse_openai({**body, "user": "u1"}, _Backend())  # type: ignore[arg-type]
    assert parsed.request.inputs == ("a",) and parsed.encoding == "base64"
    assert parsed.request.normalize and not parsed.request.truncate


def test_ollamas_routes_take_texts_truncate_by_default_and_the_older_one_is_as_pooled() -> None:
    backend: Any = _Backend()
    embed = parse_ollama({"model": "smol:latest", "input": ["a", "b"]}, backend)
    assert embed.request.inputs == ("a", "b") and embed.request.truncate
    assert not parse_ollama(
        {"model": "smol", "input": "a", "truncate": False}, backend
    ).request.truncate
    with pytest.raises(ApiError, match="input"):
        parse_ollama({"model": "smol", "input": [1, 2]}, backend)
    old = parse_ollama_old({"model": "smol", "prompt": "a"}, backend)
    assert old.request.inputs == ("a",) and not old.request.normalize
    with pytest.raises(ApiError, match="prompt"):
        parse_ollama_old({"model": "smol", "prompt": ""}, backend)


def test_base64_is_little_endian_float32_as_openai_sends_it() -> None:
    vector = [0.5, -1.25, 3.0e-8]
    raw = base64.b64decode(encoded(vector, "base64"))  # type: ignore[arg-type]
    assert struct.unpack("<3f", raw) == tuple(float(torch.tensor(v)) for v in vector)
    assert encoded(vector, "float") == vector


@pytest.mark.parametrize(
    ("value", "pooling"),
    [(None, "last"), (0, "last"), (1, "mean"), (2, "cls"), (3, "last")],
    ids=["unnamed", "none", "mean", "cls", "last"],
)
def test_a_files_pooling_type_is_llama_cpps(value: Any, pooling: str) -> None:
    assert pooling_of(value) == pooling
    assert every_row(pooling_of(value)) == (pooling != "last")


@pytest.mark.parametrize(("value", "fragment"), [(4, "rank"), (9, "9"), ("mean", "mean")])
def test_a_pooling_swarm_does_not_do_is_refused_by_name(value: Any, fragment: str) -> None:
    with pytest.raises(UnsupportedModelError, match=fragment):
        pooling_of(value)


def test_pooling_and_unit_length() -> None:
    rows = torch.tensor([[1.0, 0.0], [3.0, 4.0], [2.0, 2.0]])
    assert pool(rows, "mean").tolist() == [2.0, 2.0]
    assert pool(rows, "cls").tolist() == [1.0, 0.0]
    assert pool(rows, "last").tolist() == [2.0, 2.0]
    assert unit(torch.tensor([3.0, 4.0])).tolist() == pytest.approx([0.6, 0.8])
    assert unit(torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]
