"""The membership subsystem: the gossiper (who is in the swarm and what each member says about
itself), round-trip probes to the members that serve layers, and the hops the entry side saw
fail, which become suspects here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from swarm.config import Config
from swarm.errors import SpanError
from swarm.logs import Refusals
from swarm.membership.address_book import AddressBook
from swarm.membership.gossip import GOSSIP_BODY_BYTES, GOSSIP_PATH, Gossiper
from swarm.membership.served_span import read_served_span, span_file
from swarm.membership.view import MembershipView
from swarm.model_routing import members_of, served_models
from swarm.net.discovery import fingerprint
from swarm.net.links import Links
from swarm.net.mdns import LanDiscovery
from swarm.net.probes import RoundTrips
from swarm.runtime.gpu.share import throttling
from swarm.schema import Coverage, MemberRow, ServedModel
from swarm.types import Capacity, LayerSpan, MemberRecord, ModelId, NodeId
from swarm.wire import FrameCodec, Peer, SwarmKeys, clock_limits, shifted_clock_ns

__all__ = ["GOSSIP_BODY_BYTES", "GOSSIP_PATH", "Membership", "MembershipReport"]

_FAILURE_REPORTS = 64  # failed hops waiting to be suspected; more are dropped, oldest kept


@dataclass(frozen=True)
class MembershipReport:
    members: tuple[MemberRow, ...]
    coverage: Coverage  # of this node's model
    models: tuple[ServedModel, ...]  # every model the swarm serves, this node's first


class Membership:
    def __init__(
        self,
        gossiper: Gossiper,
        round_trips: RoundTrips,
        join: Sequence[str],
        discovery: LanDiscovery | None = None,
        fast_link: Callable[[str], bool] = lambda _: False,
    ) -> None:
        """`discovery`: announces this node on the LAN and finds members there to join;
        `fast_link`: whether an outbound fast link to an address is open now."""
        self.gossiper = gossiper
        self._fast_link = fast_link
        self.round_trips = round_trips
        self._join = tuple(join)
        self._discovery = discovery
        # the view the member hosts were last read from, and those hosts
        self._hosts: tuple[MembershipView | None, frozenset[str]] = (None, frozenset())
        # Hops the entry side found failed, for membership to suspect (bounded).
        self.failures: asyncio.Queue[NodeId] = asyncio.Queue(maxsize=_FAILURE_REPORTS)

    @classmethod
    def create(
        cls,
        config: Config,
        me: Peer,
        keys: SwarmKeys,
        links: Links,
        model: tuple[ModelId, int, tuple[str, ...]],
        capacity: Capacity,
        step_bytes: int,
        restarts: bool,
    ) -> Membership:
        """`model`: (model id, number of layers, the names clients call it by) of the model
        this node serves; `step_bytes`: what one decode step's activations weigh on the
        wire, the size round-trip probes take; `restarts`: this node's id ran before
        (`swarm.identity.ran_before`)."""
        model_id, num_layers, names = model
        record = MemberRecord(
            node_id=me.node_id,
            address=me.address,
            incarnation=int(time.time()),  # above whatever a previous run of this node announced
            model_id=model_id,
            num_layers=num_layers,
            capacity=capacity,
            span=None,
            pinned=bool(config.placement.span),
            names=names,
            resumes=_span_to_serve(config, model_id, num_layers),
        )
        clock_ns = shifted_clock_ns(config.net.test_clock_offset_s)
        limits = clock_limits(config.net.max_clock_ahead_s)
        gossip = FrameCodec(keys.gossip, me.node_id, limits, clock_ns, restarts=restarts)
        book = AddressBook(config.node.state_dir.expanduser() / f"members-{config.node.port}.json")
        gossiper = Gossiper(config.membership, record, gossip, book=book)
        join = config.node.join
        # with bootstrap addresses a node only announces itself, so that others find it
        lan = LanDiscovery(fingerprint(keys), me, browse=not join) if config.node.discover else None
        round_trips = RoundTrips(me, links, config.net, step_bytes)
        return cls(gossiper, round_trips, join, lan, links.fast_link_open)

    async def handle(self, request: web.Request) -> web.Response:
        """POST GOSSIP_PATH: one gossip frame from a peer."""
        return await self.gossiper.handle(request)

    def member_host(self, host: str) -> bool:
        """Whether `host` (a peer's IP address, as a connection shows it) is the host of an
        address a member in the view advertises, this node's own included (nodes share
        machines). Advertised names are not resolved: a member that advertises a name is
        read with the strangers."""
        view = self.gossiper.view
        seen, hosts = self._hosts
        if view is not seen:
            hosts = frozenset(_host(e.record.address) for e in view if e.record is not None)
            self._hosts = (view, hosts)
        return _host(host) in hosts

    @property
    def local(self) -> MemberRecord:
        return self.gossiper.local

    def publish(self, record: MemberRecord) -> None:
        """Announce a changed local record (span, load, speed, leaving) under a higher
        incarnation."""
        self.gossiper.update_record(record)

    async def changed_within(self, timeout_s: float, *, fresh: bool = False) -> bool:
        """Whether the view changes within `timeout_s`. A change since the last wait ended
        counts too, unless `fresh`. One reader (the rebalancer) waits on changes: a second
        would take the first one's news."""
        if fresh:
            self.gossiper.changed.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self.gossiper.changed.wait()
        except TimeoutError:
            return False
        return True

    async def quiet(self, quiet_s: float) -> None:
        """Return once no change reached the view for `quiet_s`."""
        while await self.changed_within(quiet_s, fresh=True):
            pass

    @property
    def refusals(self) -> Refusals:
        """Gossip frames refused, by reason (the HTTP server counts them in /metrics)."""
        return self.gossiper.refusals

    @property
    def unreachable_here(self) -> bool:
        """Peers take this node's gossip but none of theirs arrives: its address is wrong."""
        return self.gossiper.unreachable_here

    def clock_skew_ms(self) -> dict[str, float]:
        """Per peer id: this node's clock minus the peer's, as its gossip frames tell (ms)."""
        return self.gossiper.clock_skew_ms()

    def standing(self) -> Sequence[MemberRecord]:
        """Alive or suspect members serving this node's model: those that may serve again
        soon (a suspect refutes, or is declared dead)."""
        return members_of(self.gossiper.view.live_members(), self.local.model_id)

    def routable(self) -> Sequence[MemberRecord]:
        """Live members serving this node's model (this node included)."""
        return members_of(self.gossiper.view.alive_members(), self.local.model_id)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.gossiper.run(self._join), name="gossip")
            group.create_task(self.round_trips.run(self._serving_peers), name="rtt")
            group.create_task(self._suspect_failures(), name="failures")
            if self._discovery is not None:
                group.create_task(self._join_found(self._discovery), name="discovery")

    async def drain(self) -> None:
        """Announce the leave while the gossip loop still runs, so the news goes out."""
        await self.leave()

    async def leave(self) -> None:
        """Announce a graceful leave and give the messages a moment to go out."""
        await self.gossiper.leave()

    def status(self) -> MembershipReport:
        rtt = self.round_trips.snapshot()
        unreachable = self.gossiper.unreachable
        rows = [
            member_row(entry.record, entry.state.value, rtt.get(entry.node_id))
            if entry.node_id == self.local.node_id
            else dataclasses.replace(
                member_row(entry.record, entry.state.value, rtt.get(entry.node_id)),
                reachable=entry.record.address not in unreachable,
                heard_s_ago=_rounded(self.gossiper.heard_s_ago(entry.node_id)),
                fast_link=self._fast_link(entry.record.address),
            )
            for entry in self.gossiper.view
            if entry.record is not None
        ]
        models = self.models()
        rows_by_id = tuple(sorted(rows, key=lambda m: m.id))
        return MembershipReport(rows_by_id, models[0].coverage, models)

    def models(self) -> tuple[ServedModel, ...]:
        """Every model the alive members serve, this node's first, each with its coverage
        among its own members and the entries that take requests for it."""
        return served_models(self.gossiper.view.alive_members(), self.local)

    def _serving_peers(self) -> list[tuple[NodeId, str]]:
        return [(m.node_id, m.address) for m in self.routable() if m.span is not None]

    async def _join_found(self, discovery: LanDiscovery) -> None:
        """Join the members of this swarm that announce themselves on the LAN."""
        async with contextlib.aclosing(discovery.members()) as found:
            async for address in found:
                self.gossiper.discovered(address)

    async def _suspect_failures(self) -> None:
        """Hops the entry saw fail on the data path become suspects, which spreads the news
        and lets a node that is alive after all refute it."""
        while True:
            self.gossiper.suspect(await self.failures.get())


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _host(address: str) -> str:
    """An address's host without its port or brackets, and an IPv4 address a dual-stack
    socket shows as IPv6 (::ffff:a.b.c.d) as IPv4."""
    host = address
    if address.count(":") == 1 or address.startswith("["):
        host = address.rpartition(":")[0]
    host = host.removeprefix("[").removesuffix("]")
    return host.removeprefix("::ffff:") if "." in host else host


def member_row(record: MemberRecord, state: str, rtt_ms: float | None) -> MemberRow:
    c, h, load = record.capacity, record.health, record.load
    return MemberRow(
        id=record.node_id,
        address=record.address,
        state=state,
        span=None if record.span is None else (record.span.start, record.span.end),
        ms_per_layer_decode=round(c.ms_per_layer_decode, 4),
        ms_per_layer_prefill=round(c.ms_per_layer_prefill, 4),
        layer_memory_bytes=c.layer_memory_bytes,
        bytes_per_layer=c.bytes_per_layer,
        max_layers=c.max_layers(),
        device=c.device,
        dtype=c.dtype,
        active_sessions=load.active_sessions,
        queue_depth=load.queue_depth,
        kv_free_bytes=load.kv_free_bytes,
        gpu_temperature_c=h.gpu_temperature_c,
        gpu_utilization=h.gpu_utilization,
        gpu_memory_used_bytes=h.gpu_memory_used_bytes,
        gpu_memory_total_bytes=h.gpu_memory_total_bytes,
        gpu_power_w=h.gpu_power_w,
        gpu_throttling=throttling(h),
        model_id=record.model_id,
        model=record.names[0] if record.names else "",
        rtt_ms=None if rtt_ms is None else round(rtt_ms, 3),
        ms_per_step_fixed=round(c.ms_per_step_fixed, 4),
    )


def _span_to_serve(config: Config, model_id: ModelId, num_layers: int) -> LayerSpan | None:
    """What the record announces it `resumes` while it loads: a pinned node's own span (it
    serves nothing else, so an entry waits for it rather than refusing its layers), else the
    span it served at its last stop, if any. A pinned span outside the model is None here:
    the rebalancer refuses it at start."""
    if config.placement.span:
        try:
            span = LayerSpan.parse(config.placement.span)
            span.check_within(num_layers)
        except SpanError:
            return None
        return span
    return read_served_span(
        span_file(config.node.state_dir, config.node.port), model_id, num_layers
    )
