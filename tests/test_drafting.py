"""Drafting as pure state: what the n-gram lookup proposes, and how the draft length follows
measured acceptance and cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from swarm.config import SpeculationConfig
from swarm.inference.drafting import DraftLength, NgramDrafter, Speculation

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


def test_a_verify_step_after_which_no_length_pays_pauses_even_if_it_paid_itself() -> None:
    length = DraftLength(CONFIG)
    length.observe_plain(10.0)
    length.observe_verify(4, 4, 38.0)  # 5 tokens in 3.8 plain steps, but dear per position
    assert length.choose() == 0 and length.paused == CONFIG.pause_steps
    for _ in range(CONFIG.pause_steps):
        length.observe_plain(10.0)
    assert length.choose() == 3  # drafting resumes and measures again (first taken: 5 in 9)


def test_a_new_session_starts_from_the_last_ones_acceptance_and_pause_not_its_costs() -> None:
    last = DraftLength(CONFIG)
    last.observe_plain(10.0)
    last.observe_verify(4, 0, 30.0)  # missed: paused
    last.observe_plain(10.0)
    session = Speculation(CONFIG, model=True, carried=last)
    new = session.model_length
    assert new is not None and new is not last
    assert (new.paused, new.first_taken, new.first_tried) == (
        CONFIG.pause_steps - 1,
        last.first_taken,
        last.first_tried,
    )
    assert new.plain_ms is None and new.per_row_ms is None
    for _ in range(CONFIG.pause_steps - 1):  # the pause runs on across sessions
        assert session.model_drafts(8) == 0
        session.observe(0, 0, 10.0)
    assert session.model_drafts(8) == 2  # then one verify step measures again
    assert Speculation(CONFIG).model_drafts(8) == 0  # no draft model: none


def test_pauses_in_a_row_grow_and_a_probe_after_misses_is_short() -> None:
    length = DraftLength(replace(CONFIG, max_draft_tokens=8))
    length.observe_plain(10.0)
    pauses = []
    for _ in range(3):
        assert length.choose() > 0
        length.observe_verify(length.choose(), 0, 40.0)  # every probe misses
        pauses.append(length.paused)
        while length.paused:
            length.observe_plain(10.0)
    assert pauses == [CONFIG.pause_steps, 2 * CONFIG.pause_steps, 4 * CONFIG.pause_steps]
    assert length.choose() == 3  # the first draft's chance fell from 1/2: a shorter probe
    for _ in range(4):
        length.observe_verify(length.choose(), length.choose(), 12.0)  # then drafts pay
    assert length.misses == 0 and length.paused == 0 and length.choose() > 0
