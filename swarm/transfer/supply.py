"""How a node gets the parts it serves: a node with the model file stores them itself; one
without learns the model's index from the peers it joins through and fetches what it needs,
the entry's embedding and head first, then whatever span the plan gives it. A node given a
Hugging Face repository learns the index from the hub, and fetches each part from the peers
that hold it, else from the hub (swarm.transfer.hub)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from swarm.config import Config, RuntimeConfig
from swarm.errors import ModelNotFoundError
from swarm.runtime.checkpoint.layout import EMBED, HEAD, layer_part
from swarm.runtime.checkpoint.source import hub_ref, resolve_model
from swarm.runtime.checkpoint.store import find_fetched
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.telemetry import MeasuredSpeed, measure_speed
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.hub import HubFetcher, open_hub
from swarm.transfer.index import fetch_index
from swarm.types import LayerSpan, MemberRecord, NodeId

PROBE_LAYERS = LayerSpan(0, 1)  # a node without the file times itself on this one layer


def has_locally(runtime: RuntimeConfig) -> bool:
    """Whether the model is a file here, or an index a peer sent before."""
    try:
        resolve_model(runtime.model)
    except ModelNotFoundError:
        return find_fetched(runtime.cache_dir, runtime.model) is not None
    return True


async def open_model(
    config: Config, client: PeerClient, compute: ComputeThread
) -> tuple[ModelContext, Fetcher]:
    """The model context, with every part an entry and the speed probe need in the store."""
    runtime = config.runtime
    peers = list(config.node.join)
    hub = hub_ref(runtime.model)
    if hub is not None:
        # a hub repository: its index comes from the hub, its parts from peers or the hub
        timeout_s = config.transfer.request_timeout_s
        model = await asyncio.to_thread(open_hub, hub, runtime.model, runtime.cache_dir, timeout_s)
        runtime = dataclasses.replace(runtime, model=model.model_id)
    elif not has_locally(runtime):
        peers = await fetch_index(client, peers, runtime.model, runtime.cache_dir)
    context = await compute.run(ModelContext.open, runtime, False)
    fetcher = (
        Fetcher(context.store, client, config.transfer)
        if hub is None
        else HubFetcher(context.store, client, config.transfer, model)
    )
    first = [EMBED, HEAD, *(layer_part(i) for i in PROBE_LAYERS)]
    await fetcher.ensure(first, peers)
    return context, fetcher


def probe_speed(context: ModelContext, runtime: RuntimeConfig) -> MeasuredSpeed:
    """measure_speed, on layers this node has: a node without the file times the one layer
    it fetched for that, not four it may never serve."""
    if context.store.has_checkpoint:
        return measure_speed(context, runtime)
    shard = Shard.load(context, PROBE_LAYERS, runtime)
    return measure_speed(context, runtime, shard=shard)


def peer_addresses(records: Sequence[MemberRecord], me: NodeId, layers: LayerSpan) -> list[str]:
    """The members to ask for `layers`, those serving some of them first."""

    def serves(r: MemberRecord) -> bool:
        return r.span is not None and r.span.start < layers.end and layers.start < r.span.end

    others = [r for r in records if r.node_id != me]
    return [r.address for r in sorted(others, key=lambda r: not serves(r))]
