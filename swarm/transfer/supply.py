"""How a node gets the parts it serves: a node with the model file stores them itself; one
without learns the model's index from the peers it joins through and fetches what it needs,
the entry's embedding and head first, then whatever span the plan gives it. A node given a
Hugging Face repository learns the index from the hub, and fetches each part from the peers
that hold it, else from the hub (swarm.transfer.hub)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from swarm.config import Config, RuntimeConfig, TransferConfig
from swarm.errors import ModelNotFoundError, TransferError
from swarm.runtime.checkpoint.layout import EMBED, HEAD, layer_part
from swarm.runtime.checkpoint.source import HubRef, hub_ref, resolve_model
from swarm.runtime.checkpoint.store import find_fetched
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import heap
from swarm.telemetry import MeasuredSpeed, measure_speed
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.hub import HubFetcher, HubModel, open_hub, pulled_before
from swarm.transfer.index import fetch_index
from swarm.types import LayerSpan, MemberRecord, ModelId, NodeId

log = logging.getLogger(__name__)

PROBE_LAYERS = LayerSpan(0, 1)  # a node without the file times itself on this one layer


def has_locally(runtime: RuntimeConfig) -> bool:
    """Whether the model is a file here, or an index a peer sent before. A reference no peer
    can serve (`peers_may_serve`) that is no model here raises why, as `swarm pull` says it:
    no such file, not a model file."""
    try:
        resolve_model(runtime.model)
    except ModelNotFoundError:
        if find_fetched(runtime.cache_dir, runtime.model) is not None:
            return True
        if not peers_may_serve(runtime.model, Path(runtime.model).expanduser().exists()):
            raise
        return False
    return True


def peers_may_serve(ref: str, exists_here: bool) -> bool:
    """Whether peers may serve the model `ref` names, when no model here answers to it. They
    answer to a model's id or name (`store.answers_to`), and a name never holds a `/` or
    ends in `.gguf`: such a reference is a path (a hub repository is taken before this). A
    file or folder of that name here is what the user meant, though not a model."""
    return not (exists_here or "/" in ref or ref.endswith(".gguf") or ref.startswith("~"))


async def open_model(
    config: Config, client: PeerClient, compute: ComputeThread
) -> tuple[ModelContext, Fetcher]:
    """The model context, with every part an entry and the speed probe need in the store."""
    runtime = config.runtime
    peers = list(config.node.join)
    hub = hub_ref(runtime.model)
    model = None
    if hub is not None:
        # a hub repository: its index comes from the hub, its parts from peers or the hub
        model, model_id = await _open_hub(hub, runtime, config.transfer)
        runtime = dataclasses.replace(runtime, model=model_id)
    elif not has_locally(runtime):
        peers = await fetch_index(client, peers, runtime.model, runtime.cache_dir)
    context = await compute.run(ModelContext.open, runtime, False)
    fetcher = (
        Fetcher(context.store, client, config.transfer)
        if model is None
        else HubFetcher(context.store, client, config.transfer, model)
    )
    first = [EMBED, HEAD, *(layer_part(i) for i in PROBE_LAYERS)]
    if not context.store.has_checkpoint:  # where it has, a load stores a changed part again
        changed = await compute.run(context.store.discard_changed, first)
        if changed:
            log.warning(
                "stored %s did not match the hashes recorded when they arrived: discarded,"
                " fetching them again",
                ", ".join(changed),
            )
    await fetcher.ensure(first, peers)
    return context, fetcher


async def _open_hub(
    hub: HubRef, runtime: RuntimeConfig, transfer: TransferConfig
) -> tuple[HubModel | None, ModelId]:
    """The repository at its current commit and its id; no HubModel when the hub cannot be
    reached but an earlier `swarm pull` (or run) indexed it here, so a machine prepared
    before it went offline still starts, on the parts it holds and those peers send."""
    try:
        model = await asyncio.to_thread(
            open_hub, hub, runtime.model, runtime.cache_dir, transfer.request_timeout_s
        )
    except TransferError as e:
        pulled = pulled_before(hub, runtime.cache_dir)
        if pulled is None:
            raise
        log.warning("%s; running the copy indexed here before (model id %s)", e, pulled[:16])
        return None, pulled
    return model, model.model_id


def probe_speed(context: ModelContext, runtime: RuntimeConfig) -> MeasuredSpeed:
    """measure_speed, on layers this node has: a node without the file times the one layer
    it fetched for that, not four it may never serve. The probe's layers are dropped before
    the node loads its span, and the heap pages they freed are handed back (27 MB of a 7B
    probe's four layers stayed resident otherwise)."""
    try:
        if context.store.has_checkpoint:
            return measure_speed(context, runtime)
        return measure_speed(context, runtime, shard=Shard.load(context, PROBE_LAYERS, runtime))
    finally:
        heap.trim()


def peer_addresses(records: Sequence[MemberRecord], me: NodeId, layers: LayerSpan) -> list[str]:
    """The members to ask for `layers`, those serving some of them first."""

    def serves(r: MemberRecord) -> bool:
        return r.span is not None and r.span.start < layers.end and layers.start < r.span.end

    others = [r for r in records if r.node_id != me]
    return [r.address for r in sorted(others, key=lambda r: not serves(r))]
