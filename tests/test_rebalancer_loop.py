"""The rebalancer's loop on one node, with the tiny model, a real compute thread and a
membership of one: a round loads the span `decide` gives, serves it and announces it; the next
stays; a leaving node plans nothing. The rules themselves are tests/test_rebalance_decide.py's;
moves across real node processes are the end-to-end tests'."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from harness.disks import fill_to, small_disk
from harness.factories import member
from swarm.config import Config, RuntimeConfig
from swarm.membership.gossip import Gossiper
from swarm.membership.subsystem import Membership
from swarm.rebalancing.decide import Announce, Reason, Stay
from swarm.rebalancing.loop import Rebalancer, RebalancerParts
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.types import LayerSpan, NodeId
from swarm.wire import FrameCodec, SwarmKeys, generate_secret

ROUND_S = 60.0  # a round loads the model's layers on a busy machine well within this


def _one_node(runtime: RuntimeConfig) -> tuple[Rebalancer, RebalancerParts]:
    """The rebalancer of a node alone: the model, a compute thread, a membership of one."""
    context = ModelContext.open(runtime, progress=False)
    me = dataclasses.replace(member("me"), num_layers=context.num_layers, span=None)
    keys = SwarmKeys.derive(generate_secret())
    gossiper = Gossiper(Config.local().membership, me, FrameCodec(keys.frame, NodeId("me")))
    membership = Membership(gossiper, None, ())  # type: ignore[arg-type]  # no probes here
    # no refresher runs here: housekeeping's meter is never read
    parts = RebalancerParts(context, ComputeThread(1), membership, Serving(), None)  # type: ignore[arg-type]
    return Rebalancer.create(Config.local(), parts), parts


async def test_a_round_loads_serves_and_announces_the_planned_span(
    tiny_runtime: RuntimeConfig,
) -> None:
    rebalancer, parts = _one_node(tiny_runtime)
    context, compute, membership, serving = (
        parts.context,
        parts.compute,
        parts.membership,
        parts.serving,
    )
    me = membership.local
    whole = LayerSpan(0, context.num_layers)
    try:
        await asyncio.wait_for(rebalancer.rebalance(), ROUND_S)
        assert rebalancer.last == Announce(Reason.NOTHING_GIVEN_UP, whole, settle=False)
        assert serving.span == whole and membership.local.span == whole
        assert rebalancer.plan is not None and rebalancer.plan.span_of(me.node_id) == whole

        await asyncio.wait_for(rebalancer.rebalance(), ROUND_S)
        assert isinstance(rebalancer.last, Stay) and rebalancer.last.reason is Reason.IN_PLACE

        membership.publish(dataclasses.replace(membership.local, draining=True))
        await asyncio.wait_for(rebalancer.rebalance(), ROUND_S)
        assert rebalancer.last == Stay(Reason.DRAINING)
    finally:
        compute.close()


async def test_a_full_disk_stops_the_move_not_the_node(
    tiny_runtime: RuntimeConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The layers are written to the cache as they load: on a full disk the round says so in
    one line naming the path and serves on; with room again the next round loads them."""
    with small_disk(tmp_path / "disk", 16) as disk:
        rebalancer, parts = _one_node(dataclasses.replace(tiny_runtime, cache_dir=disk))
        context, compute, membership, serving = (
            parts.context,
            parts.compute,
            parts.membership,
            parts.serving,
        )
        filler = fill_to(disk, 0)
        try:
            with caplog.at_level(logging.WARNING, logger="swarm.rebalancing.loop"):
                await asyncio.wait_for(rebalancer.rebalance(), ROUND_S)
            assert serving.span is None and membership.local.span is None
            (line,) = [r.getMessage() for r in caplog.records if "cannot load" in r.getMessage()]
            assert str(disk) in line and "No space left on device" in line, line
            assert "serving nothing meanwhile" in line
            assert not [p for p in disk.rglob("*") if ".tmp" in p.name], "half-written files"
            filler.unlink()
            await asyncio.wait_for(rebalancer.rebalance(), ROUND_S)
            assert serving.span == LayerSpan(0, context.num_layers)
        finally:
            compute.close()
