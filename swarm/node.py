"""The composition root: builds a node's parts, runs their loops in one task group, stops them
in order. No protocol logic lives here."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from swarm.admin import SLOWDOWN_PATH, Admin, Pace
from swarm.api.app import add_routes
from swarm.api.guard import ApiPolicy
from swarm.config import LOOPBACK_HOSTS, Config
from swarm.errors import CacheWriteError, ConfigError
from swarm.inference.batching import DecodeBatcher
from swarm.inference.dispatch import serve_inbox
from swarm.inference.hop import HopServer
from swarm.inference.remote import RemotePipeline, StepWaiters
from swarm.inference.route_choice import route_chooser
from swarm.inference.service import InferenceService
from swarm.leaving import drain
from swarm.membership.gossip import GOSSIP_PATH, Gossiper
from swarm.net.addresses import advertised_address
from swarm.net.endpoint import Inbox
from swarm.net.links import LINK_PATH, Links
from swarm.net.probes import RoundTrips
from swarm.rebalancer import Rebalancer, RecordRefresher
from swarm.runtime.compute import ComputeThread
from swarm.runtime.entry import EntryModel
from swarm.runtime.model import ModelContext
from swarm.runtime.serving import Serving
from swarm.status import node_status
from swarm.telemetry import SpeedMeter, capacity, measure_speed
from swarm.types import MemberRecord, NodeId
from swarm.wire import Codec, FrameCodec, Peer, SwarmKeys, load_secret

log = logging.getLogger(__name__)

# a gossip full state fits well inside; API routes have their own, smaller api.max_body_bytes
_MAX_BODY_BYTES = 80 * 1024 * 1024


@dataclass
class Node:
    config: Config
    node_id: NodeId
    context: ModelContext
    compute: ComputeThread
    entry: EntryModel
    links: Links
    inbox: Inbox
    waiters: StepWaiters
    round_trips: RoundTrips
    gossiper: Gossiper
    serving: Serving
    hop: HopServer
    rebalancer: Rebalancer
    pipeline: RemotePipeline
    runner: web.AppRunner
    address: str
    service: InferenceService
    admin: Admin
    leave_requested: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def create(cls, config: Config) -> Node:
        keys = _keys(config)
        policy = _api_policy(config)  # a missing token file fails before anything loads
        node_id = _node_id(config.node.state_dir, config.node.port)
        port = config.node.port or _free_port(config.node.host)
        advertised = advertised_address(config.node, port)  # a bad address fails before loading
        address = advertised.address
        log.info("advertising %s to peers (%s)", address, advertised.how)
        runtime = config.runtime
        compute = ComputeThread(runtime.threads, runtime.compute_queue_size)
        context = await compute.run(ModelContext.open, runtime, False)
        entry = await compute.run(EntryModel, context)
        prefill_ms, decode_ms = await compute.run(measure_speed, context, runtime)
        speed = SpeedMeter(prefill_ms, decode_ms)
        frames = FrameCodec(keys.frame, node_id)
        links, inbox = Links(frames, config.net), Inbox(frames, config.net)
        record = MemberRecord(
            node_id=node_id,
            address=address,
            incarnation=int(time.time()),  # above whatever a previous run of this node announced
            model_id=context.store.manifest.model_id,
            num_layers=context.num_layers,
            capacity=capacity(context, runtime, speed),
            span=None,
            slowdown=runtime.slowdown,
        )
        gossiper = Gossiper(config.membership, record, FrameCodec(keys.gossip, node_id))
        serving = Serving()
        waiters = StepWaiters()
        pace = Pace(runtime.slowdown)
        slowdown = lambda: pace.slowdown  # noqa: E731
        batcher = (
            DecodeBatcher(compute, serving, slowdown, runtime.max_batch)
            if runtime.max_batch > 1
            else None
        )
        hop = HopServer(node_id, serving, compute, links, slowdown, speed, batcher)
        settle_s = max(1.0, 4 * config.membership.gossip_interval_s)
        refresher = RecordRefresher(speed, serving)
        rebalancer = Rebalancer(
            context, runtime, config.placement, compute, gossiper, serving, settle_s, refresher
        )
        me = Peer(node_id, address)
        round_trips = RoundTrips(me, links, config.net)
        codec = Codec[config.net.activation_codec.upper()]
        chooser = route_chooser(
            lambda: gossiper.view.routable_members(gossiper.local.model_id),
            context.num_layers,
            round_trips.snapshot,
        )
        pipeline = RemotePipeline(me, links, waiters, chooser, round_trips, config.net, codec)
        service = InferenceService(
            config.runtime.model,
            entry,
            pipeline,
            compute,
            lambda: node_status(node),
            int(getattr(context.config, "max_position_embeddings", 2048)),
        )
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        runner = web.AppRunner(app, access_log=None)
        node = cls(
            config,
            node_id,
            context,
            compute,
            entry,
            links,
            inbox,
            waiters,
            round_trips,
            gossiper,
            serving,
            hop,
            rebalancer,
            pipeline,
            runner,
            address,
            service,
            Admin(FrameCodec(keys.frame, node_id), pace, gossiper),
        )
        node._add_routes(app, policy)
        await runner.setup()
        await web.TCPSite(runner, config.node.host, port).start()
        return node

    def _add_routes(self, app: web.Application, policy: ApiPolicy) -> None:
        app.router.add_get(LINK_PATH, self.inbox.handle)
        app.router.add_post(GOSSIP_PATH, self.gossiper.handle)
        app.router.add_post(SLOWDOWN_PATH, self.admin.handle)
        add_routes(app, self.service, policy)

    async def run(self) -> None:
        """Serve until cancelled (stops at once) or until `leave_requested` is set, which
        leaves gracefully: see `swarm.leaving`."""
        log.info("node %s serving on %s", self.node_id, self.address)
        try:
            async with asyncio.TaskGroup() as group:
                inbox = serve_inbox(self.inbox, self.hop, self.waiters, self.round_trips)
                tasks = [
                    group.create_task(self.gossiper.run(self.config.node.join), name="gossip"),
                    group.create_task(self.rebalancer.run(), name="rebalancer"),
                    group.create_task(inbox, name="inbox"),
                    group.create_task(self.round_trips.run(self._routable_peers), name="rtt"),
                    group.create_task(self._report_failures(), name="failures"),
                ]
                await self.leave_requested.wait()
                await drain(self)
                for task in tasks:
                    task.cancel()
        finally:
            await self.stop()

    def _routable_peers(self) -> list[tuple[NodeId, str]]:
        model = self.gossiper.local.model_id
        members = self.gossiper.view.routable_members(model)
        return [(m.node_id, m.address) for m in members if m.span is not None]

    async def _report_failures(self) -> None:
        """Hops the entry saw fail on the data path become suspects in membership, which
        spreads the news and lets a node that is alive after all refute it."""
        while True:
            failed = await self.pipeline.failures.get()
            self.gossiper.suspect(failed)

    async def stop(self) -> None:
        await self.gossiper.leave()
        await self.links.close()
        await self.runner.cleanup()
        self.compute.close()


def _keys(config: Config) -> SwarmKeys:
    secret = load_secret(config.node.secret_file) if config.node.secret_file else None
    if secret is not None:
        return SwarmKeys.derive(secret)
    if config.node.host not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"binding to {config.node.host} needs a swarm secret (node.secret_file); "
            "without one a node listens on loopback only. Run `swarm keygen` to make one."
        )
    log.warning("no swarm secret configured: listening on loopback only")
    return SwarmKeys.loopback()


def _api_policy(config: Config) -> ApiPolicy:
    api = config.api
    return ApiPolicy(
        token=api.resolve_token(),
        max_body_bytes=api.max_body_bytes,
        max_concurrent_requests=api.max_concurrent_requests,
        retry_after_s=api.retry_after_s,
    )


def _node_id(state_dir: Path, port: int) -> NodeId:
    """Stable per machine and port, kept on disk, so a restarted node keeps its identity.
    A node on an ephemeral port (0) gets a fresh id each run."""
    if port == 0:
        return NodeId(uuid.uuid4().hex[:12])
    path = state_dir.expanduser() / f"node-{port}.id"
    try:
        if path.is_file():
            return NodeId(path.read_text().strip())
        path.parent.mkdir(parents=True, exist_ok=True)
        node_id = uuid.uuid4().hex[:12]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(node_id)
        tmp.rename(path)
        return NodeId(node_id)
    except OSError as e:
        raise CacheWriteError(f"cannot keep the node id in {path.parent}: {e.strerror}") from None


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
