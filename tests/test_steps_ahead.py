"""A session's next plain step sent from the compute thread as soon as the head sampled its
token: which tokens let it go (no drafts may follow, no end of text, room for another), how
the pipeline's plan becomes a step and the step a reply to wait on, and what is forgotten
when a session ends or the send fails. End to end: tests/test_swarm_e2e.py counts the steps
sent ahead where the text matches one process."""

from __future__ import annotations

import asyncio
import copy
import itertools
import random

import pytest
import torch

from swarm.config import RuntimeConfig, SpeculationConfig
from swarm.inference.ahead import NextStep, StepsAhead
from swarm.inference.drafting import Speculation
from swarm.inference.generation import _stops_after
from swarm.inference.head import EntryHead
from swarm.inference.waiters import StepWaiters
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.execution.shard import Shard
from swarm.sampling_settings import SamplingSettings
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import Codec, Hop, Peer, ResultMessage

CONFIG = SpeculationConfig(max_draft_tokens=4, ngram_max=3, ngram_min=1, pause_steps=5)
ROUTE = (Hop(NodeId("n1"), "127.0.0.1:1", LayerSpan(0, 30)),)
ME = Peer(NodeId("entry"), "127.0.0.1:2")
S = SessionId("s")


def _measured(speculation: Speculation, paused: int) -> Speculation:
    speculation.observe(0, 0, 10.0)  # a plain step measured: the lookup may draft now
    speculation.length.paused = paused
    return speculation


@pytest.mark.parametrize("paused", [0, 1, 2, 6])
@pytest.mark.parametrize("seed", range(4))
def test_the_tokens_after_which_drafts_follow_are_the_ones_the_lookup_would_find(
    paused: int, seed: int
) -> None:
    """Whatever the token, the generation's own lookup after it drafts exactly when the set
    said it would: a step sent ahead is never one the generation wanted to carry drafts."""
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(40)]
    speculation = _measured(Speculation(CONFIG), paused)
    for at in range(5, len(tokens)):
        history = tokens[:at]
        pausing = speculation.length.pauses_past_next()
        drafting = speculation.drafting_tokens(history, room=3)
        assert drafting is not None
        for token in range(7):
            after = copy.deepcopy(speculation)
            after.observe(0, 0, 10.0)  # the step that samples `token` is a plain one
            drafts = after.drafts([*history, token], 3)
            assert bool(drafts) == (token in drafting), (history, token)
        if pausing:
            assert drafting == frozenset()
        speculation.drafts(history, 3)  # the generation's own lookup for the step
        speculation.observe(0, 0, 10.0)


def test_no_room_for_drafts_means_none_follow_and_a_draft_model_may_follow_any() -> None:
    speculation = _measured(Speculation(CONFIG), 0)
    assert speculation.drafting_tokens([1, 2, 1, 2], room=0) == frozenset()
    with_model = _measured(Speculation(CONFIG, model=True), 0)
    assert with_model.drafting_tokens([1, 2, 1, 2], room=3) is None
    assert with_model.model_length is not None
    with_model.model_length.paused = 2  # the model pauses past the next step: lookup alone
    assert with_model.drafting_tokens([1, 2, 1, 2], room=3) == frozenset({1, 2})


@pytest.mark.parametrize(
    ("speculating", "room", "expected"),
    [
        (False, 0, None),  # this step's token is the last: nothing goes on
        (False, 1, frozenset()),
        (True, 0, None),
        (True, 1, frozenset()),  # the next step has no room for drafts
        (True, 5, frozenset({1, 2})),  # what followed 1, and 1 and 2 themselves
    ],
)
def test_a_step_goes_on_ahead_only_with_room_and_where_no_drafts_follow(
    speculating: bool, room: int, expected: frozenset[int] | None
) -> None:
    speculation = _measured(Speculation(CONFIG), 0) if speculating else None
    assert _stops_after(speculation, [1, 2, 1], room) == expected


def _ahead() -> tuple[StepsAhead, StepWaiters]:
    waiters = StepWaiters()
    return StepsAhead(waiters, itertools.count(100), asyncio.get_running_loop()), waiters


def test_a_planned_step_leaves_from_the_thread_and_the_pipeline_takes_it() -> None:
    async def scenario() -> None:
        ahead, waiters = _ahead()
        hidden = torch.ones(1, 1, 8)
        assert ahead.next_step(S, 8, hidden) is None  # nothing planned
        ahead.plan(S, NextStep(ROUTE, ME, Codec.RAW, 8))
        assert ahead.next_step(S, 9, hidden) is None  # planned for another position
        ahead.plan(S, NextStep(ROUTE, ME, Codec.RAW, 8))
        leaving = ahead.next_step(S, 8, hidden)
        assert leaving is not None
        message = leaving.message
        assert (message.session, message.position, message.route) == (S, 8, ROUTE)
        assert message.entry == ME and message.hidden is hidden and not message.verify
        assert ahead.next_step(S, 8, hidden) is None  # one step per plan
        ahead.sent(leaving, True, 1.0, 0.25)
        assert ahead.count == 1
        taken = ahead.take(S, 8)
        assert taken is not None and taken.step == message.step and taken.send_ms == 0.25
        assert waiters.claim(S, message.step)  # its reply is awaited
        assert ahead.take(S, 8) is None  # taken once

    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["send failed", "cancelled", "other position"])
def test_a_step_that_did_not_leave_or_is_not_wanted_is_forgotten(how: str) -> None:
    async def scenario() -> None:
        ahead, waiters = _ahead()
        ahead.plan(S, NextStep(ROUTE, ME, Codec.RAW, 8))
        leaving = ahead.next_step(S, 8, torch.ones(1, 1, 8))
        assert leaving is not None
        if how == "cancelled":  # the request ended while the step was leaving
            ahead.cancel(S)
        ahead.sent(leaving, how != "send failed", 1.0, 0.25)
        if how == "other position":  # the generation went elsewhere (never, by design)
            assert ahead.take(S, 9) is None
        else:
            assert ahead.take(S, 8) is None
        assert not waiters.claim(S, leaving.message.step)  # no waiter is left behind

    asyncio.run(scenario())


def test_the_head_lets_a_step_go_on_only_after_tokens_that_do_not_stop_it(
    tiny_runtime: RuntimeConfig,
) -> None:
    """run_claimed returns the results whose sessions go on from the token sampled; a step
    sent ahead whose result comes before the generation took the token before it is not
    claimed (the generation samples it, with that token in its history)."""
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    history = [5, 6, 7]
    out = shard.forward(S, entry.embed(history), 0)[:, -1:]
    greedy = int(entry.logits(out).argmax())

    async def scenario() -> None:
        waiters, compute = StepWaiters(), ComputeThread(threads=1)
        try:
            head = EntryHead(entry, compute, claim=waiters.claim)
            sampler = Sampler(SamplingSettings(), len(history))
            for step, (stops, goes) in enumerate(
                [(None, False), (frozenset({greedy}), False), (frozenset(), True)]
            ):
                assert head.arm(S, sampler, history, stops)
                waiters.expect(S, step)
                result = ResultMessage(S, step, len(history) - 1, out)
                early = ResultMessage(S, step, len(history), out)  # the step after, early
                assert not head.claims(early) and head.claims(result)
                going = await compute.run(head.run_claimed, [result])
                assert [r for r, _ in going] == ([result] if goes else []), stops
                # timed from the sampling where its next step leaves from the thread
                assert all(sampled.sampled_at is not None for _, sampled in going)
                head.forget(S)
        finally:
            compute.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("drafts", "sampled_at", "began"),
    [(False, None, 5.0), (False, 3.0, 3.0), (True, 3.0, 5.0), (False, 6.0, 5.0)],
)
def test_a_plain_step_sent_ahead_is_timed_from_where_its_token_was_sampled(
    drafts: bool, sampled_at: float | None, began: float
) -> None:
    from swarm.inference.generation import _began

    assert _began(5.0, drafts, sampled_at) == began
