from __future__ import annotations

import pytest
import torch

from swarm.errors import SamplingError
from swarm.runtime.execution.sampling import (
    Sampler,
    apply_openai_penalties,
    apply_repetition_penalty,
)
from swarm.sampling_settings import BOUNDS, SamplingSettings

LOGITS = torch.tensor([1.0, 3.0, 2.5, -1.0, 0.5])


def test_greedy_takes_the_argmax() -> None:
    assert Sampler(SamplingSettings()).next_token(LOGITS, []) == 1


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    sampler = Sampler(SamplingSettings(temperature=2.0, top_k=1, seed=1))
    assert {sampler.next_token(LOGITS, []) for _ in range(50)} == {1}


def test_tiny_top_p_keeps_only_the_best() -> None:
    sampler = Sampler(SamplingSettings(temperature=1.0, top_p=0.01, seed=1))
    assert {sampler.next_token(LOGITS, []) for _ in range(50)} == {1}


def test_top_p_keeps_the_nucleus() -> None:
    # softmax of LOGITS: token 1 ~0.53, token 2 ~0.32; 0.8 needs both, never the rest
    sampler = Sampler(SamplingSettings(temperature=1.0, top_p=0.8, seed=3))
    seen = {sampler.next_token(LOGITS, []) for _ in range(200)}
    assert seen == {1, 2}


def test_seed_makes_sampling_reproducible() -> None:
    params = SamplingSettings(temperature=1.0, seed=1234)
    first = [Sampler(params).next_token(LOGITS, []) for _ in range(1)]
    a, b = Sampler(params), Sampler(params)
    assert [a.next_token(LOGITS, []) for _ in range(30)] == [
        b.next_token(LOGITS, []) for _ in range(30)
    ]
    assert first


def test_repetition_penalty_discourages_seen_tokens() -> None:
    penalized = apply_repetition_penalty(LOGITS, [1, 3], 2.0)
    assert penalized[1] == 1.5 and penalized[3] == -2.0 and penalized[2] == 2.5
    assert Sampler(SamplingSettings(repetition_penalty=2.0)).next_token(LOGITS, [1]) == 2


def test_openai_penalties_are_additive_and_count_only_generated_tokens() -> None:
    # token 1 generated twice, token 2 once: frequency per time, presence once each
    penalized = apply_openai_penalties(LOGITS, [1, 2, 1], presence=0.5, frequency=0.25)
    assert penalized.tolist() == pytest.approx([1.0, 3.0 - 0.5 - 0.5, 2.5 - 0.25 - 0.5, -1.0, 0.5])
    # the prompt (the first 3 tokens of the history) is never penalized
    sampler = Sampler(SamplingSettings(presence_penalty=2.0), prompt_tokens=3)
    assert sampler.next_token(LOGITS, [1, 1, 1]) == 1
    assert sampler.next_token(LOGITS, [1, 1, 1, 1]) == 2  # 3 - 2 < 2.5
    # a negative frequency penalty rewards repeats: token 4 twice is 0.5 + 2 * 2 > 3
    negative = Sampler(SamplingSettings(frequency_penalty=-2.0), prompt_tokens=0)
    assert negative.next_token(LOGITS, [4]) == 1
    assert negative.next_token(LOGITS, [4, 4]) == 4


def test_logit_bias_forces_and_bans_tokens() -> None:
    assert Sampler(SamplingSettings(logit_bias=((3, 100.0),))).next_token(LOGITS, []) == 3
    banned = Sampler(SamplingSettings(temperature=1.0, seed=1, logit_bias=((1, -100.0),)))
    assert 1 not in {banned.next_token(LOGITS, []) for _ in range(100)}


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    # probabilities relative to the best: token 2 ~0.61, token 0 ~0.14, token 4 ~0.08
    sampler = Sampler(SamplingSettings(temperature=1.0, min_p=0.5, seed=2))
    assert {sampler.next_token(LOGITS, []) for _ in range(200)} == {1, 2}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"top_p": -0.1},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_tokens": 0},
        {"repetition_penalty": 0.0},
        {"stop": ("",)},
        {"temperature": float("nan")},
        {"min_p": 1.5},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3.0},
        {"logit_bias": ((1, 101.0),)},
        {"logprobs": 21},
        {"seed": 2**64},
    ],
)
def test_invalid_parameters_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(SamplingError) as caught:
        SamplingSettings(**kwargs)  # type: ignore[arg-type]
    assert caught.value.param == next(iter(kwargs))  # the field is named, for the API's 400


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_bound_admits_its_ends(name: str) -> None:
    bound = BOUNDS[name]
    for value in (bound.low, bound.high):
        if value != float("inf"):
            SamplingSettings(**{name: value})  # type: ignore[arg-type]


def test_top_p_zero_keeps_only_the_most_likely_token() -> None:
    sampler = Sampler(SamplingSettings(temperature=1.0, top_p=0.0, seed=1))
    assert {sampler.next_token(LOGITS, []) for _ in range(50)} == {1}
