"""What a node does between re-plans that decides nothing about its span: expiring idle
sessions, releasing the shards it moved away from once nobody uses them, re-measuring its pace
while it is idle, and republishing speed, load and GPU health when they drift from what the
swarm last heard."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from swarm.config import RuntimeConfig
from swarm.membership.subsystem import Membership
from swarm.rebalancing.decide import may_release
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.runtime.gpu.device import Accelerator
from swarm.runtime.gpu.share import throttling
from swarm.telemetry import SpeedMeter, measure_speed
from swarm.types import Health, LayerSpan, Load, MemberRecord

log = logging.getLogger(__name__)

_DRIFT = 0.2  # a measured speed this far from the announced one is announced again
_TEMPERATURE_DRIFT_C = 2.0  # a GPU temperature this far from the announced one is announced
_IDLE_MEASURE_S = 60.0  # seconds without a real step after which a node re-measures itself


@dataclass
class RecordRefresher:
    """Publishes measured speed, load and GPU health when they drift from what the swarm
    last heard."""

    speed: SpeedMeter
    serving: Serving
    compute: ComputeThread  # its queue depth is the load routing weighs
    gpu: Accelerator  # the node's device: its readings (none on a CPU)

    def refreshed(self, record: MemberRecord) -> MemberRecord | None:
        old = record.capacity
        capacity = dataclasses.replace(
            old,
            ms_per_layer_prefill=self.speed.prefill_ms,
            ms_per_layer_decode=self.speed.decode_ms,
            decode_row_share=self.speed.cost.row_share,
            ms_per_step_fixed=self.speed.fixed_ms,
        )
        shard = self.serving.shard
        sessions = len(shard.kv.sessions()) if shard is not None else 0
        kv_free = shard.kv.budget_bytes - shard.kv.session_bytes if shard is not None else 0
        drifted = (
            _drifted(old.ms_per_layer_decode, capacity.ms_per_layer_decode)
            or _drifted(old.ms_per_layer_prefill, capacity.ms_per_layer_prefill)
            or _drifted(old.decode_row_share, capacity.decode_row_share)
            or _drifted(old.ms_per_step_fixed, capacity.ms_per_step_fixed)
        )
        health = self.gpu.readings()
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
    if throttling(announced) != throttling(measured):  # a GPU that turns hot says so at once
        return True
    was_w, now_w = announced.gpu_power_w, measured.gpu_power_w
    if now_w is not None and (was_w is None or _drifted(was_w, now_w)):
        return True
    was_c, now_c = announced.gpu_temperature_c, measured.gpu_temperature_c
    if (was_c is None) != (now_c is None):
        return True
    if was_c is not None and now_c is not None and abs(now_c - was_c) >= _TEMPERATURE_DRIFT_C:
        return True
    used, was = measured.gpu_memory_used_bytes, announced.gpu_memory_used_bytes
    return used is not None and (was is None or _drifted(float(was), float(used)))


@dataclass
class Housekeeping:
    context: ModelContext  # the layers the idle benchmark runs
    runtime: RuntimeConfig
    membership: Membership  # the view releases check, and where the record is republished
    refresher: RecordRefresher  # its meter, serving and compute thread are the node's
    grace_s: float  # seconds a retired shard keeps serving: entries still route to it
    clock: Callable[[], float] = time.monotonic

    async def once(self) -> None:
        """Expire idle sessions, release idle retired shards, re-measure when idle and
        republish speed and load; on the compute thread, which owns the KV caches."""
        compute, serving = self.refresher.compute, self.refresher.serving
        for shard in serving.all():
            await compute.run(shard.kv.evict_idle)
        me, members = self.membership.local, self.membership.routable()

        def covered(span: LayerSpan) -> bool:
            return may_release(span, members, me.node_id)

        released = await compute.run(serving.release_idle, self.clock(), self.grace_s, covered)
        if released:
            log.info("released layers %s: no session uses them any more", released)
        await self._measure_when_idle()
        updated = await compute.run(self.refresher.refreshed, self.membership.local)
        if updated is not None:
            self.membership.publish(updated)

    async def _measure_when_idle(self) -> None:
        """Keep the announced pace true while no real steps feed it (another program may have
        started or stopped on this machine): a short benchmark on the layers served."""
        speed, serving = self.refresher.speed, self.refresher.serving
        shard = serving.shard
        # the meter stamps real steps with time.monotonic, not this loop's clock
        if shard is None or time.monotonic() - speed.last_record < _IDLE_MEASURE_S:
            return
        if any(s.kv.sessions() for s in serving.all()):
            return
        measured = await self.refresher.compute.run(
            measure_speed, self.context, self.runtime, 32, 8, 3, shard
        )
        speed.calibrate(measured)
