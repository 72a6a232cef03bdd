from __future__ import annotations

import torch

from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, SessionId

OLD, NEW = SessionId("in-flight"), SessionId("new")


def test_a_moved_node_finishes_its_sessions_on_the_old_span(tiny_runtime: RuntimeConfig) -> None:
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    serving = Serving()
    assert serving.shard_for(OLD, LayerSpan(0, 2)) is None  # nothing served yet
    serving.move_to(Shard.load(context, LayerSpan(0, 2), tiny_runtime))
    assert serving.shard_for(OLD, LayerSpan(1, 3)) is None  # past the span's end
    first = serving.shard_for(OLD, LayerSpan(0, 2))
    assert first is not None
    first.forward(OLD, entry.embed([5, 6, 7]), 0)

    serving.move_to(Shard.load(context, LayerSpan(0, 4), tiny_runtime))
    assert serving.span == LayerSpan(0, 4)
    assert serving.shard_for(OLD, LayerSpan(0, 2)) is first  # keeps its cache
    assert serving.shard_for(NEW, LayerSpan(0, 2)) is serving.shard
    assert serving.shard_for(NEW, LayerSpan(2, 4)) is serving.shard
    assert serving.shard_for(NEW, LayerSpan(3, 6)) is None
    assert serving.release_idle() == []  # the in-flight session still needs layers 0:2

    out = first.forward(OLD, entry.embed([8]), 3)
    assert out.shape == (1, 1, 64) and torch.isfinite(out).all()
    first.close_session(OLD)
    assert serving.release_idle() == [LayerSpan(0, 2)]
    assert serving.all() == [serving.shard]


def test_a_reloaded_node_finishes_nothing_on_the_blocks_it_replaced(
    tiny_runtime: RuntimeConfig,
) -> None:
    """A reload (an entry found its blocks computing wrong bits): the shard it served and
    the shards it was moving away from are dropped at once, sessions and all; a session's
    next step finds no cache and fails, so its entry replays it."""
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    serving = Serving()
    serving.move_to(Shard.load(context, LayerSpan(0, 2), tiny_runtime))
    serving.move_to(Shard.load(context, LayerSpan(0, 4), tiny_runtime))
    assert serving.shard is not None
    serving.shard.forward(OLD, entry.embed([5, 6, 7]), 0)
    assert len(serving.all()) == 2

    fresh = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    serving.move_to(fresh, finish=False)
    assert serving.all() == [fresh] and serving.retiring == []
    assert serving.shard_for(OLD, LayerSpan(0, 4)) is fresh and not fresh.has_session(OLD)
    assert serving.release_idle() == []
