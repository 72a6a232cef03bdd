"""GPU readings from the node's device to what the swarm sees: a stand-in device with fixed
readings (temperature, memory, utilisation, power, throttle reasons) feeds the node's real
record refresher, the record goes out through membership and the gossip wire format, and
each member's status row says whether its GPU runs slowed."""

from __future__ import annotations

import dataclasses

import pytest

from harness.factories import member
from swarm.config import MembershipConfig, NetConfig
from swarm.membership.gossip import Gossiper
from swarm.membership.subsystem import Membership
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.net.probes import RoundTrips
from swarm.rebalancing.housekeeping import RecordRefresher
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.runtime.gpu.device import HostAccelerator
from swarm.telemetry import SpeedMeter, StepCost
from swarm.types import Health, NodeId
from swarm.wire import FrameCodec, Peer, SwarmKeys, generate_secret
from swarm.wire.fields import Fields

COOL = Health(
    gpu_temperature_c=64.0,
    gpu_utilization=0.75,
    gpu_memory_used_bytes=9 * 2**30,
    gpu_memory_total_bytes=24 * 2**30,
    gpu_power_w=212.5,
    gpu_throttle_reasons=0x1,  # idle clocks: not slowed
)
HOT = dataclasses.replace(COOL, gpu_temperature_c=91.0, gpu_throttle_reasons=0x20)


class SteadyGpu(HostAccelerator):
    """The CPU stand-in for a GPU, reading `health` every time."""

    def __init__(self, health: Health) -> None:
        self.health = health

    def readings(self) -> Health:
        return self.health


def _membership() -> Membership:
    keys = SwarmKeys.derive(generate_secret())
    me = member("me")
    gossiper = Gossiper(MembershipConfig(), me, FrameCodec(keys.frame, NodeId("me")))
    probes = RoundTrips(Peer(me.node_id, me.address), None, NetConfig(), 0)  # type: ignore[arg-type]
    return Membership(gossiper, probes, ())


@pytest.mark.parametrize(
    ("health", "slowed"), [(COOL, None), (HOT, "hot (91 C), thermal (software)")]
)
async def test_readings_reach_the_record_its_wire_form_and_the_status_row(
    health: Health, slowed: str | None
) -> None:
    compute = ComputeThread(1, 4)
    try:
        gpu = SteadyGpu(health)
        refresher = RecordRefresher(
            SpeedMeter(4.0, StepCost(0.0, 1.0, 0.0)), Serving(), compute, gpu
        )
        membership = _membership()
        updated = await compute.run(refresher.refreshed, membership.local)
        assert updated is not None and updated.health == health
        membership.publish(updated)
        heard = record_from_wire(Fields(record_to_wire(membership.local), "record"))
        assert heard.health == health  # power and throttle reasons travel too
        (row,) = membership.status().members
        assert (row.gpu_temperature_c, row.gpu_power_w) == (health.gpu_temperature_c, 212.5)
        assert (row.gpu_utilization, row.gpu_memory_used_bytes) == (0.75, 9 * 2**30)
        assert row.gpu_throttling == slowed
        # a GPU that turns hot is announced at once, and a steady one is not announced again
        gpu.health = HOT if health == COOL else COOL
        assert await compute.run(refresher.refreshed, membership.local) is not None
        gpu.health = health
        assert await compute.run(refresher.refreshed, membership.local) is None
    finally:
        compute.close()


async def test_a_cpu_node_has_no_readings() -> None:
    compute = ComputeThread(1, 4)
    try:
        # a row costs as much in a batch as alone: the row share a record has by default
        refresher = RecordRefresher(
            SpeedMeter(4.0, StepCost(0.0, 0.0, 1.0)), Serving(), compute, HostAccelerator()
        )
        record = member("me")
        assert await compute.run(refresher.refreshed, record) is None  # nothing drifted
    finally:
        compute.close()
