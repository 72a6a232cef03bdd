"""A node reloads its span at an entry's request (swarm/inference/reload.py), with the tiny
model, a real compute thread and store, and a membership of one: the fresh blocks compute
what the store holds, not the flipped byte of the first load; a stored part changed on disk
is caught by its hash and never loaded; a second request within the interval, and one from
a stranger, are refused. Fetching such a part again from a peer runs over a real transfer
server. The rules are tests/test_spot_checks.py's; the whole path across node processes is
tests/test_spot_checks_e2e.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest
import torch

from harness.factories import member
from harness.transfer_sender import KEY, start
from swarm.config import Config, RuntimeConfig, TransferConfig
from swarm.inference.reload import Reloader, verified_span
from swarm.membership.gossip import Gossiper
from swarm.membership.subsystem import Membership
from swarm.rebalancing.loop import RebalancerParts
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import Shard
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.index import fetch_index
from swarm.transfer.protocol import TransferCodec
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import FrameCodec, ReloadLayers, SwarmKeys, generate_secret

SPAN = LayerSpan(0, 4)  # the tiny model's every layer
FLIP = "2:300"  # a byte of layer 2's weights, in memory at the first load
CHANGED = layer_part(1)  # a stored part whose file changes on disk


def _spoil(store: ModelStore, part: str) -> bytes:
    """Flip a byte in the middle of a stored part's file, leaving its recorded hash as it
    was (a bad sector); the file's bytes before."""
    path = store.folder / store.manifest.parts[part].file
    before = path.read_bytes()
    data = bytearray(before)
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return before


def _output(shard: Shard) -> torch.Tensor:
    hidden = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(3))
    return shard.forward(SessionId("probe"), hidden, 0)


def _node_of_one(runtime: RuntimeConfig) -> tuple[Reloader, RebalancerParts]:
    context = ModelContext.open(runtime, progress=False)
    me = dataclasses.replace(member("me"), num_layers=context.num_layers, span=SPAN)
    keys = SwarmKeys.derive(generate_secret())
    gossiper = Gossiper(Config.local().membership, me, FrameCodec(keys.frame, NodeId("me")))
    membership = Membership(gossiper, None, ())  # type: ignore[arg-type]  # no probes here
    parts = RebalancerParts(context, ComputeThread(1), membership, Serving(), None)  # type: ignore[arg-type]
    config = dataclasses.replace(Config.local(), runtime=runtime)
    return Reloader(config, parts), parts


async def test_a_reload_builds_fresh_blocks_from_the_store_and_never_loads_a_changed_part(
    tiny_runtime: RuntimeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    flipped = dataclasses.replace(tiny_runtime, test_flip_byte=FLIP)
    reloader, parts = _node_of_one(flipped)
    context, compute, serving, membership = (
        parts.context,
        parts.compute,
        parts.serving,
        parts.membership,
    )
    try:
        right = _output(Shard.load(context, SPAN, tiny_runtime))
        first = await compute.run(Shard.load, context, SPAN, flipped)
        await compute.run(serving.move_to, first)
        wrong = await compute.run(_output, first)
        assert not torch.equal(wrong, right)  # the fault is real
        before = _spoil(context.store, CHANGED)
        me = membership.local.node_id

        with caplog.at_level(logging.WARNING, logger="swarm.inference.reload"):
            await asyncio.wait_for(reloader.asked(me, ReloadLayers(SessionId("s"), 7)), 60)
        assert serving.shard is not first and serving.retiring == []
        assert torch.equal(await compute.run(_output, serving.shard), right)  # cured
        path = context.store.folder / context.store.manifest.parts[CHANGED].file
        assert path.read_bytes() == before  # stored again from the model file
        (line,) = [r.getMessage() for r in caplog.records if "reloaded" in r.getMessage()]
        assert f"{CHANGED} did not match its recorded hash: discarded, stored again" in line
        assert "session s, position 7" in line, line
        assert membership.local.reloads == 1 and reloader.done == 1

        reloaded = serving.shard
        await reloader.asked(me, ReloadLayers(SessionId("s"), 9))  # within the interval
        await reloader.asked(NodeId("stranger"), ReloadLayers(SessionId("s"), 9))
        assert serving.shard is reloaded and reloader.refused == 2
        assert membership.local.reloads == 1
        refusals = [r.getMessage() for r in caplog.records if "not reloading" in r.getMessage()]
        assert "at most once in 600 s" in refusals[0] and "not a member" in refusals[1]
    finally:
        compute.close()


async def test_a_part_changed_on_disk_is_fetched_again_from_a_peer_before_any_load(
    tiny_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(tiny_folder), tmp_path / "a")
    parts = [layer_part(i) for i in SPAN]
    for part in parts:
        holder.load_part(part)  # stored, as a node serving them has them
    runner, address, _ = await start(holder, "a")
    client = PeerClient(TransferCodec(KEY, NodeId("b")), 10.0)
    try:
        model_id = holder.manifest.model_id
        await fetch_index(client, [address], model_id, tmp_path / "b")
        store = ModelStore.open(model_id, tmp_path / "b")  # no model file here
        fetcher = Fetcher(store, client, TransferConfig())
        await fetcher.ensure(parts, [address])
        _spoil(store, CHANGED)

        found = await verified_span(store, SPAN, lambda names: fetcher.ensure(names, [address]))
        assert (
            found
            == f"{CHANGED} did not match its recorded hash: discarded, fetched again from a peer"
        )
        for part in parts:  # every part as the holder has it
            record = store.manifest.parts[part]
            assert (store.folder / record.file).read_bytes() == (
                holder.folder / record.file
            ).read_bytes()
        found = await verified_span(store, SPAN, lambda names: fetcher.ensure(names, []))
        assert found == "all 4 stored parts matched their recorded hashes"
    finally:
        await client.close()
        await runner.cleanup()
