from __future__ import annotations

import pytest
import torch

from swarm.errors import SamplingError
from swarm.runtime.sampling import Sampler, SamplingParams, apply_repetition_penalty

LOGITS = torch.tensor([1.0, 3.0, 2.5, -1.0, 0.5])


def test_greedy_takes_the_argmax() -> None:
    assert Sampler(SamplingParams()).next_token(LOGITS, []) == 1


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    sampler = Sampler(SamplingParams(temperature=5.0, top_k=1, seed=1))
    assert {sampler.next_token(LOGITS, []) for _ in range(50)} == {1}


def test_tiny_top_p_keeps_only_the_best() -> None:
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=0.01, seed=1))
    assert {sampler.next_token(LOGITS, []) for _ in range(50)} == {1}


def test_top_p_keeps_the_nucleus() -> None:
    # softmax of LOGITS: token 1 ~0.53, token 2 ~0.32; 0.8 needs both, never the rest
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=0.8, seed=3))
    seen = {sampler.next_token(LOGITS, []) for _ in range(200)}
    assert seen == {1, 2}


def test_seed_makes_sampling_reproducible() -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    first = [Sampler(params).next_token(LOGITS, []) for _ in range(1)]
    a, b = Sampler(params), Sampler(params)
    assert [a.next_token(LOGITS, []) for _ in range(30)] == [
        b.next_token(LOGITS, []) for _ in range(30)
    ]
    assert first


def test_repetition_penalty_discourages_seen_tokens() -> None:
    penalized = apply_repetition_penalty(LOGITS, [1, 3], 2.0)
    assert penalized[1] == 1.5 and penalized[3] == -2.0 and penalized[2] == 2.5
    assert Sampler(SamplingParams(repetition_penalty=2.0)).next_token(LOGITS, [1]) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_tokens": 0},
        {"repetition_penalty": 0.0},
        {"stop": ("",)},
        {"temperature": float("nan")},
    ],
)
def test_invalid_parameters_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(SamplingError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
