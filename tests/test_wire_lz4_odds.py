"""When a frame's body is compressed: only where it saves 1/16 of it, and a message type whose
bodies stopped paying tries again every RETRY_EVERY-th frame."""

from __future__ import annotations

import pytest
import torch

from swarm.types import LayerSpan, SessionId
from swarm.wire import FrameCodec, Hop, NodeId, Peer, StepMessage
from swarm.wire.auth import SwarmKeys, generate_secret
from swarm.wire.frame import is_compressed
from swarm.wire.lz4_odds import (
    MISSES_BEFORE_SKIPPING,
    RETRY_EVERY,
    Lz4Odds,
    pays,
    should_try,
)
from swarm.wire.messages import MessageType

KEYS = SwarmKeys.derive(generate_secret())
RX = NodeId("receiver")
ROUTE = (Hop(NodeId("n1"), "10.0.0.1:7070", LayerSpan(0, 30)),)
ENTRY = Peer(NodeId("e"), "10.0.0.9:7070")


@pytest.mark.parametrize(
    ("raw", "packed", "kept"),
    [
        (1600, 1500, True),
        (1600, 1501, False),
        (2304, 2295, False),
        (2304, 2400, False),
        (64, 4, True),
    ],
)
def test_a_compressed_body_is_kept_where_it_saves_a_sixteenth(
    raw: int, packed: int, kept: bool
) -> None:
    assert pays(raw, packed) is kept


@pytest.mark.parametrize(
    ("misses", "since", "tries"),
    [
        (0, 0, True),
        (MISSES_BEFORE_SKIPPING - 1, 0, True),
        (MISSES_BEFORE_SKIPPING, 0, False),
        (MISSES_BEFORE_SKIPPING, RETRY_EVERY - 1, False),
        (MISSES_BEFORE_SKIPPING, RETRY_EVERY, True),
        (100, RETRY_EVERY + 5, True),
    ],
)
def test_a_kind_tries_while_its_tries_pay_and_now_and_then_after(
    misses: int, since: int, tries: bool
) -> None:
    assert should_try(misses, since) is tries


def test_the_odds_skip_a_kind_that_stopped_paying_and_find_it_paying_again() -> None:
    odds = Lz4Odds()
    step, gossip = int(MessageType.STEP), int(MessageType.GOSSIP)
    for _ in range(MISSES_BEFORE_SKIPPING):
        assert odds.try_next(step)
        odds.tried(step, paid=False)
    assert odds.try_next(gossip)  # each kind its own odds
    tries = [odds.try_next(step) for _ in range(RETRY_EVERY + 1)]
    assert tries == [False] * RETRY_EVERY + [True]
    odds.tried(step, paid=True)  # the retry paid: the kind tries every frame again
    assert all(odds.try_next(step) for _ in range(3))


def _step(hidden: torch.Tensor) -> StepMessage:
    return StepMessage(SessionId("s"), 1, 0, hidden, ROUTE, ENTRY)


def test_a_codec_stops_compressing_dense_activations_and_still_compresses_sparse_ones() -> None:
    sender, receiver = FrameCodec(KEYS.frame, NodeId("s")), FrameCodec(KEYS.frame, RX)
    dense = [sender.encode(_step(torch.randn(1, 4, 576)), RX) for _ in range(RETRY_EVERY)]
    assert not any(is_compressed(frame) for frame in dense)
    # skipping now: a sparse body goes raw until the kind's next try, then compressed again
    sparse = [sender.encode(_step(torch.zeros(1, 4, 576)), RX) for _ in range(RETRY_EVERY)]
    assert not is_compressed(sparse[0]) and is_compressed(sparse[-1])
    for frame in [*dense, *sparse]:
        assert isinstance(receiver.decode(frame).message, StepMessage)
