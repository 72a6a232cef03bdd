"""Drafting as pure state: what the n-gram lookup proposes, and how the draft length follows
measured acceptance and cost."""

from __future__ import annotations

import pytest

from swarm.config import SpeculationConfig
from swarm.inference.drafting import DraftLength, NgramDrafter

CONFIG = SpeculationConfig(max_draft_tokens=4, ngram_max=3, ngram_min=1, pause_steps=5)


@pytest.mark.parametrize(
    ("tokens", "limit", "proposed"),
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 4, [4, 5, 1, 2]),  # the longest end found first
        ([1, 2, 3, 4, 5, 1, 2, 3], 1, [4]),
        ([1, 2, 3, 4, 5, 1, 2, 3], 0, []),
        ([7, 8, 9, 1, 2, 3, 9], 3, [1, 2, 3]),  # only the last token matches
        ([7, 8, 9, 1, 2, 3, 4], 3, []),  # the end never occurred before
        ([5, 6, 1, 5, 6, 2, 5, 6], 2, [2, 5]),  # the latest occurrence, not the first
        ([4, 4, 4, 4], 3, [4]),  # what follows runs up to the end
        ([], 3, []),
    ],
)
def test_the_lookup_proposes_what_followed_the_latest_occurrence(
    tokens: list[int], limit: int, proposed: list[int]
) -> None:
    assert NgramDrafter(CONFIG).propose(tokens, limit) == proposed


def test_the_lookup_grows_with_the_sequence_as_one_lookup_over_all_of_it() -> None:
    drafter = NgramDrafter(CONFIG)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    for token in [5, 3, 5, 8, 9, 7, 9, 3, 1, 4, 1]:
        tokens.append(token)
        assert drafter.propose(tokens, 3) == NgramDrafter(CONFIG).propose(tokens, 3)
    assert drafter.propose(tokens, 3) == [5, 9, 2]


def test_the_length_waits_for_a_plain_step_then_tries_half_the_longest() -> None:
    length = DraftLength(CONFIG)
    assert length.choose() == 0
    length.observe_plain(10.0)
    assert length.choose() == 2


def test_cheap_verify_steps_with_high_acceptance_keep_the_longest_draft() -> None:
    length = DraftLength(CONFIG)
    length.observe_plain(10.0)
    for _ in range(10):
        length.observe_verify(4, 4, 12.0)  # 5 tokens for 1.2 plain steps
    assert length.expected_tokens(4) > 4.0
    assert length.choose() == 4


def test_runs_that_break_after_their_first_token_shorten_the_draft() -> None:
    length = DraftLength(CONFIG)
    length.observe_plain(10.0)
    for _ in range(10):
        length.observe_verify(4, 1, 14.0)
    assert 0 < length.choose() <= 2


def test_a_verify_step_that_does_not_pay_pauses_drafting_then_it_tries_again() -> None:
    length = DraftLength(CONFIG)
    length.observe_plain(10.0)
    length.observe_verify(4, 0, 30.0)  # one token for three plain steps' time
    assert length.paused == CONFIG.pause_steps
    for _ in range(CONFIG.pause_steps):
        assert length.choose() == 0
        length.observe_plain(10.0)
    assert length.choose() == 2  # measured afresh
