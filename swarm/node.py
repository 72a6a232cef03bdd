"""The composition root: wires the five subsystems of a node (transfer, membership, hop side,
entry side, HTTP), runs them in one task group, drains them in reverse order to leave, and
merges their status reports. No policy and no protocol logic lives here; nothing imports this
module but the command line."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import psutil

from swarm.api.guard import ApiPolicy
from swarm.api.server import HttpServer, PeerRoute
from swarm.config import Config
from swarm.identity import node_id, ran_before
from swarm.inference.entry_side import EntrySide, open_draft_model
from swarm.inference.hop_side import LINK_PATH, HopParts, HopSide
from swarm.inference.thread_steps import OwnEntry
from swarm.inference.waiters import StepWaiters
from swarm.membership.subsystem import GOSSIP_BODY_BYTES, GOSSIP_PATH, Membership
from swarm.net.addresses import advertised_address
from swarm.net.fast_links import FastLinks
from swarm.net.keys import swarm_keys
from swarm.net.links import Links
from swarm.net.ports import BoundPorts
from swarm.private_files import warn_open_secret_files
from swarm.runtime.checkpoint.source import served_names
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.schema import ModelInfo, NodeInfo, NodeLoad, NodeStatus, TransferReport
from swarm.telemetry import SpeedMeter, capacity
from swarm.transfer.subsystem import MAX_REQUEST_BYTES, TRANSFER_PATH, Transfer
from swarm.transfer.supply import probe_speed
from swarm.types import NodeId
from swarm.wire import (
    FRAME_VERSION,
    FrameCodec,
    Peer,
    SwarmKeys,
    activation_limits,
    clock_limits,
    shifted_clock_ns,
)

log = logging.getLogger(__name__)


@dataclass
class Node:
    node_id: NodeId
    address: str
    compute: ComputeThread
    links: Links
    membership: Membership
    hop: HopSide
    entry: EntrySide
    http: HttpServer
    transfer: Transfer
    leave_requested: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def create(cls, config: Config, ports: BoundPorts) -> Node:
        """The node on `ports`, which the caller binds before it imports this module and torch,
        so that a port that is taken fails the start at once (`swarm.net.ports`); closes them
        if it fails."""
        try:
            keys = swarm_keys(config.node)
            policy = ApiPolicy.from_config(config.api)  # a missing token file fails before loading
            warn_open_secret_files(config)
            return await cls._build(config, keys, policy, ports)
        except BaseException:
            ports.close()
            raise

    @classmethod
    async def _build(
        cls, config: Config, keys: SwarmKeys, policy: ApiPolicy, ports: BoundPorts
    ) -> Node:
        restarts = ran_before(config.node.state_dir, config.node.port)
        me_id = node_id(config.node.state_dir, config.node.port)
        advertised = advertised_address(config.node, ports.http_port)  # before loading, too
        log.info("advertising %s to peers (%s)", advertised.address, advertised.how)
        runtime = config.runtime
        compute = ComputeThread(runtime.threads, runtime.compute_queue_size)
        # the index a peer asks for names the members serving now; asked only once serving,
        # after membership below exists
        membership: Membership
        members = lambda: [r.address for r in membership.routable()]  # noqa: E731
        transfer, context = await Transfer.open(
            config, keys.frame, me_id, compute, members, restarts
        )
        entry_model = await compute.run(EntryModel, context)
        draft_model = await open_draft_model(config, compute, entry_model)
        speed = SpeedMeter.measured(await compute.run(probe_speed, context, runtime))
        me = Peer(me_id, advertised.address)
        # a link carries at most one prefill chunk of this model's hidden states per frame
        clocked = clock_limits(config.net.max_clock_ahead_s)
        limits = activation_limits(context.hidden_size, runtime.prefill_chunk_tokens, clocked)
        clock_ns = shifted_clock_ns(config.net.test_clock_offset_s)
        native = config.net.native_frames
        frames = FrameCodec(keys.frame, me_id, limits, clock_ns, native=native, restarts=restarts)
        fast = FastLinks(frames, config.net) if ports.fast is not None else None
        links = Links(frames, config.net, fast)
        manifest = context.store.manifest
        names = served_names(config.api.served_model_name, manifest.source)
        model = (manifest.model_id, context.num_layers, names)
        step_bytes = context.hidden_size * context.dtype.itemsize
        membership = Membership.create(
            config, me, keys, links, model, capacity(context, runtime, speed), step_bytes, restarts
        )
        waiters = StepWaiters()
        parts = HopParts(context, compute, links, speed, membership, waiters, transfer, ports.fast)
        reads_fast = ports.fast is not None  # the compute thread reads fast links
        entry = EntrySide.create(
            config,
            context,
            entry_model,
            compute,
            links,
            membership,
            waiters,
            draft_model,
            heads_where_results_arrive=reads_fast,
        )
        service = entry.service
        own_entry = OwnEntry(service.head, lambda: service.in_flight, entry.pipeline.ahead)
        hop = HopSide.create(config, parts, frames, own_entry)
        wire = WireFacts(advertised.how, frames)
        status = lambda: merge_status(membership, hop, entry, transfer.status(), wire)  # noqa: E731
        routes = [
            PeerRoute("GET", LINK_PATH, hop.inbox.handle, 0),  # frames travel as messages
            PeerRoute("POST", GOSSIP_PATH, membership.handle, GOSSIP_BODY_BYTES),
            PeerRoute("POST", TRANSFER_PATH, transfer.handle, MAX_REQUEST_BYTES),
        ]
        refusals = (hop.inbox.refusals, membership.refusals)
        http = HttpServer(
            policy,
            entry.service,
            status,
            membership.models,
            routes,
            config.net,
            refusals,
            membership.member_host,
        )
        try:
            await http.start(ports.http)
        except OSError as e:  # another process bound it too, and listened first
            raise ports.http_failure(e) from None
        return cls(me_id, me.address, compute, links, membership, hop, entry, http, transfer)

    @property
    def fast_port(self) -> int | None:
        """The port this node takes fast links on; None without them."""
        return None if self.hop.fast is None else self.hop.fast.port

    async def run(self) -> None:
        """Serve until cancelled (stops at once) or until `leave_requested` is set: then drain
        the subsystems in the reverse of their start order, and stop."""
        log.info("node %s serving on %s", self.node_id, self.address)
        # Leaving in reverse: HTTP refuses new requests, the hop side hands its layers over,
        # the entry side finishes its streams, membership says goodbye.
        subsystems = (self.transfer, self.membership, self.entry, self.hop, self.http)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(s.run()) for s in subsystems]
                await self.leave_requested.wait()
                log.info("leaving: taking no new requests; handing over layers and sessions")
                for subsystem in reversed(subsystems):
                    await subsystem.drain()
                for task in tasks:
                    task.cancel()
        finally:
            await self.stop()

    def status(self) -> NodeStatus:
        return self.http.status()

    async def stop(self) -> None:
        await self.membership.leave()
        await self.links.close()
        await self.transfer.close()
        await self.http.stop()
        try:  # the kept prompt blocks, for the next start; losing them loses nothing else
            await self.hop.write_prompt_cache()
            self.entry.write_prompt_keys()
        except Exception:
            log.exception("could not write the prompt cache")
        self.compute.close()


@dataclass(frozen=True)
class WireFacts:
    """What /status says of how peers reach this node and open its frames."""

    address_because: str  # why it advertises its address
    frames: FrameCodec  # its clock and limits


def merge_status(
    membership: Membership,
    hop: HopSide,
    entry: EntrySide,
    transfer: TransferReport,
    wire: WireFacts,
) -> NodeStatus:
    """What GET /status shows, before the HTTP subsystem adds its own part."""
    m, h, e = membership.status(), hop.status(), entry.status()
    me = membership.local
    rss = psutil.Process().memory_info().rss
    load = NodeLoad(rss, entry=e.load, hop=h.load, prompt_cache=h.prompt_cache)
    span = None if me.span is None else (me.span.start, me.span.end)
    return NodeStatus(
        node=NodeInfo(
            me.node_id,
            me.address,
            span,
            load,
            reachable_by_peers=not membership.unreachable_here,
            address_because=wire.address_because,
            fast_port=None if hop.fast is None else hop.fast.port,
            clock_unix=round(wire.frames.now_unix(), 3),
            clock_window_s=wire.frames.limits.clock_window_us / 1e6,
            clock_ahead_s=wire.frames.limits.clock_ahead_us / 1e6,
            protocol_version=FRAME_VERSION,
        ),
        model=ModelInfo(e.model_name, me.model_id, h.layers),
        members=m.members,
        coverage=m.coverage,
        models=m.models,
        sessions=e.sessions,
        plan=h.plan,
        clock_skew_ms=membership.clock_skew_ms(),
        transfer=transfer,
        speculation=e.speculation,
        spot_checks=e.spot_checks,
    )
