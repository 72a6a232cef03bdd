"""The loop that re-plans from the membership view and moves this node's span.

Every node runs the same deterministic placement on its view and acts only on its own line.
A move is make-before-break, across nodes too: the node loads its new layers while its old
shard keeps serving and stays announced; it announces the new span (dropping layers from its
record) only once the layers it gives up are announced by the members that take them over, or
after placement.handoff_timeout_s when they never are (two nodes swapping spans wait on each
other). When the members taking them over wait on no one (they only add layers, or give up
layers others also serve), the node waits for them as long as they take to load, up to
_PATIENT_HANDOFFS timeouts: a slow machine loading its new layers must not open a gap. So the
moves of one re-plan order themselves: nodes that only add layers announce at
once, and the ones that drop layers follow as their successors appear. The old shard then
stays for the sessions it holds and is released once none uses it. A cool-down keeps a node
from moving twice in quick succession."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swarm import placement
from swarm.config import PlacementConfig, RuntimeConfig
from swarm.errors import TransferError
from swarm.membership.gossip import Gossiper
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import Shard
from swarm.telemetry import GpuMonitor, SpeedMeter, measure_speed
from swarm.transfer.subsystem import Transfer
from swarm.transfer.supply import peer_addresses
from swarm.types import Health, LayerSpan, Load, MemberRecord, NodeId

log = logging.getLogger(__name__)


_DRIFT = 0.2  # a measured speed this far from the announced one is announced again
_TEMPERATURE_DRIFT_C = 2.0  # a GPU temperature this far from the announced one is announced
_IDLE_MEASURE_S = 60.0  # seconds without a real step after which a node re-measures itself
_HANDOFF_POLL_S = 0.2  # seconds between looks at who announces the layers being given up
_PATIENT_HANDOFFS = 10  # handoff timeouts a node waits for takers that wait on no one


@dataclass
class RecordRefresher:
    """Publishes measured speed, load and GPU health when they drift from what the swarm
    last heard."""

    speed: SpeedMeter
    serving: Serving
    compute: ComputeThread  # its queue depth is the load routing weighs
    gpu: GpuMonitor = field(default_factory=GpuMonitor)

    def refreshed(self, record: MemberRecord) -> MemberRecord | None:
        old = record.capacity
        capacity = dataclasses.replace(
            old,
            ms_per_layer_prefill=self.speed.prefill_ms,
            ms_per_layer_decode=self.speed.decode_ms,
        )
        shard = self.serving.shard
        sessions = len(shard.kv.sessions()) if shard is not None else 0
        kv_free = shard.kv.budget_bytes - shard.kv.used_bytes if shard is not None else 0
        drifted = _drifted(old.ms_per_layer_decode, capacity.ms_per_layer_decode) or _drifted(
            old.ms_per_layer_prefill, capacity.ms_per_layer_prefill
        )
        health = self.gpu.read()
        queue = self.compute.queue_depth
        if (
            not drifted
            and sessions == record.load.active_sessions
            and queue == record.load.queue_depth
            and not _health_drifted(record.health, health)
        ):
            return None
        load = Load(active_sessions=sessions, queue_depth=queue, kv_free_bytes=kv_free)
        return dataclasses.replace(record, capacity=capacity, load=load, health=health)


def _drifted(announced: float, measured: float) -> bool:
    return abs(measured - announced) > _DRIFT * max(announced, 1e-9)


def _health_drifted(announced: Health, measured: Health) -> bool:
    was_c, now_c = announced.gpu_temperature_c, measured.gpu_temperature_c
    if (was_c is None) != (now_c is None):
        return True
    if was_c is not None and now_c is not None and abs(now_c - was_c) >= _TEMPERATURE_DRIFT_C:
        return True
    used, was = measured.gpu_memory_used_bytes, announced.gpu_memory_used_bytes
    return used is not None and (was is None or _drifted(float(was), float(used)))


class Rebalancer:
    def __init__(
        self,
        context: ModelContext,
        runtime: RuntimeConfig,
        config: PlacementConfig,
        compute: ComputeThread,
        gossiper: Gossiper,
        serving: Serving,
        settle_s: float,
        refresher: RecordRefresher,
        fetcher: Transfer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._context = context
        self._runtime = runtime
        self._config = config
        self._compute = compute
        self._gossiper = gossiper
        self.serving = serving
        self._settle_s = settle_s  # the view must be quiet this long before a move
        self._clock = clock
        self._refresher = refresher
        self._fetcher = fetcher  # None: every part is in this node's store or its file
        self._last_move = -float("inf")
        self._paces: dict[NodeId, tuple[float, ...]] = {}  # members' recent decode paces
        self.plan: placement.Plan | None = None
        self._move: placement.Move | None = None  # the last re-plan set out, to check it
        self._missed = 0.0  # the most that move's gain fell short of its promise so far
        self._pinned: LayerSpan | None = None  # set by config: this node never moves
        if config.span:
            self._pinned = LayerSpan.parse(config.span)
            self._pinned.check_within(context.num_layers)  # SpanError: the node does not start

    async def run(self) -> None:
        while True:
            await self._quiet()
            await self.rebalance()
            await self._housekeeping()
            try:
                async with asyncio.timeout(self._settle_s * 4):
                    await self._gossiper.changed.wait()
            except TimeoutError:
                pass

    async def _housekeeping(self) -> None:
        """Expire idle sessions and republish speed and load; on the compute thread, which
        owns the KV caches."""
        for shard in self.serving.all():
            await self._compute.run(shard.kv.evict_idle)
        grace_s = 4 * self._settle_s  # several gossip rounds for every entry to see the move
        me = self._gossiper.local
        records = self._gossiper.view.routable_members(me.model_id)

        def covered(span: LayerSpan) -> bool:
            return placement.covered_by_others(span, records, me.node_id, alone=False)

        released = await self._compute.run(
            self.serving.release_idle, self._clock(), grace_s, covered
        )
        if released:
            log.info("released layers %s: no session uses them any more", released)
        await self._measure_when_idle()
        updated = await self._compute.run(self._refresher.refreshed, self._gossiper.local)
        if updated is not None:
            self._gossiper.update_record(updated)

    async def _measure_when_idle(self) -> None:
        """Keep the announced pace true while no real steps feed it (another program may have
        started or stopped on this machine): a short benchmark on the layers served."""
        speed, shard = self._refresher.speed, self.serving.shard
        if shard is None or time.monotonic() - speed.last_record < _IDLE_MEASURE_S:
            return
        if any(s.kv.sessions() for s in self.serving.all()):
            return
        measured = await self._compute.run(
            measure_speed, self._context, self._runtime, 32, 8, 3, shard
        )
        speed.calibrate(measured)

    async def _handed_off(
        self, current: LayerSpan | None, target: LayerSpan, plan: placement.Plan
    ) -> None:
        """Wait until the layers of `current` outside `target` are announced by others: at most
        placement.handoff_timeout_s, or _PATIENT_HANDOFFS times that while the members `plan`
        gives them to wait on no handoff of their own (see `placement.handoff_is_one_way`)."""
        if current is None or self._pinned is not None:
            return
        dropped = [layer for layer in current if layer not in target]
        layers = [LayerSpan(i, i + 1) for i in dropped]
        me = self._gossiper.local.node_id
        timeout_s = self._config.handoff_timeout_s
        started = self._clock()
        patient = False
        while True:
            records = self._gossiper.view.routable_members(self._gossiper.local.model_id)
            waiting = [s for s in layers if not placement.covered_by_others(s, records, me)]
            if not waiting:
                # the successors' records reached this node; give them a few gossip rounds
                # to reach every entry before this node's record stops listing the layers
                await asyncio.sleep(self._settle_s)
                return
            waited_s = self._clock() - started
            if waited_s >= timeout_s:
                one_way = placement.handoff_is_one_way(plan, records, me, dropped)
                if one_way and not patient:
                    log.info(
                        "still waiting for the members taking over layers %s to load them",
                        ", ".join(str(s) for s in waiting),
                    )
                patient = one_way
                if not one_way or waited_s >= _PATIENT_HANDOFFS * timeout_s:
                    log.warning(
                        "giving up layers %s that no other member announced within %.0f s",
                        ", ".join(str(s) for s in waiting),
                        waited_s,
                    )
                    return
            self._gossiper.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_HANDOFF_POLL_S):
                    await self._gossiper.changed.wait()

    async def _fetched(self, target: LayerSpan, records: Sequence[MemberRecord]) -> bool:
        """Bring the layers of `target` this node lacks from the peers (while its old span
        keeps serving); False when they cannot be had now (a later re-plan tries again)."""
        if self._fetcher is None:
            return True
        peers = peer_addresses(records, self._gossiper.local.node_id, target)
        try:
            await self._fetcher.ensure([layer_part(i) for i in target], peers)
        except TransferError as e:
            log.warning("cannot load layers %s yet: %s", target, e)
            return False
        return True

    async def _quiet(self) -> None:
        """Wait until no membership change arrived for settle_s."""
        while True:
            self._gossiper.changed.clear()
            try:
                async with asyncio.timeout(self._settle_s):
                    await self._gossiper.changed.wait()
            except TimeoutError:
                return

    async def rebalance(self) -> None:
        me = self._gossiper.local
        if me.draining:
            return
        records = self._gossiper.view.routable_members(me.model_id)
        # a leaving node's layers are planned as gone, so the others cover them before it goes
        records = (*(r for r in records if r.node_id != me.node_id and not r.draining), me)
        self._paces = placement.remember_paces(self._paces, records)
        records, config = placement.steady(records, self._paces, self._config)
        num_layers = self._context.num_layers
        running = placement.evaluate(records, num_layers)
        if self._move is not None:
            missed = placement.missed_gain(self._move, running, records)
            self._missed = max(self._missed, missed or 0.0)
        threshold = max(config.rebalance_threshold, self._missed)
        config = dataclasses.replace(config, rebalance_threshold=threshold)
        proposed = placement.plan(records, num_layers, config)
        self.plan = proposed
        if proposed.spans != running.spans and (
            self._move is None or proposed.spans != self._move.after.spans
        ):
            self._move, self._missed = placement.Move.of(running, proposed), 0.0
        target = proposed.span_of(me.node_id)
        current = self.serving.span
        pinned = self._pinned
        if pinned is not None:
            target = pinned
        if target == current or target is None:
            return
        if current is not None and pinned is None and not placement.fills_a_hole(running, proposed):
            if self._clock() - self._last_move < self._config.cooldown_s:
                return
            transfer_s = 0.0 if self._fetcher is None else self._fetcher.seconds_for(target)
            if not placement.worth_moving(
                running,
                proposed,
                config.rebalance_threshold,
                transfer_s,
                self._config.transfer_payback_s,
            ):
                return
        log.info(
            "plan: this node serves layers %s (was %s); loading them (bottleneck %.1f -> %.1f"
            " tokens/s, threshold %.0f%%, paces %s ms/layer)",
            target,
            current,
            running.bottleneck,
            proposed.bottleneck,
            100 * config.rebalance_threshold,
            ", ".join(f"{r.node_id[:8]} {r.capacity.ms_per_layer_decode:.3f}" for r in records),
        )
        if not await self._fetched(target, records):
            return
        shard = await self._compute.run(
            Shard.load, self._context, target, self._runtime, self.serving.shard
        )
        await self._handed_off(current, target, proposed)
        await self._compute.run(self.serving.move_to, shard, self._clock())
        self._last_move = self._clock()
        self._gossiper.update_record(dataclasses.replace(self._gossiper.local, span=target))
        log.info("serving layers %s", target)
