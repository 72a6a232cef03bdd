"""A partition that outlasts `dead_reclaim_s` heals by itself: five hosts in network
namespaces (harness/netns.py), cut 3 versus 2 for four times the reclaim time, so that each side
has forgotten the other and no full sync is left to merge them. The remembered addresses
(swarm.membership.rejoin) are knocked on at backed-off intervals; once the network returns the
swarm is one again, and the side that could not serve the model serves again.

Nodes run the `lan` preset with shorter membership timings (reclaim after 10 s, knocks at most
10 s apart), so the test takes about two minutes instead of the hour a LAN's timings need."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.netns import Lab, unavailable
from harness.netns_swarm import all_see_all_alive, ask, five_hosts, views_of
from harness.polling import until

UNAVAILABLE = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}"),
]

RECLAIM_S = 10.0
KNOCK_MAX_S = 10.0
TIMINGS = {
    "SWARM_MEMBERSHIP_PUSH_PULL_INTERVAL_S": "5",
    "SWARM_MEMBERSHIP_DEAD_RECLAIM_S": str(RECLAIM_S),
    "SWARM_MEMBERSHIP_REJOIN_INTERVAL_S": "2",
    "SWARM_MEMBERSHIP_REJOIN_MAX_INTERVAL_S": str(KNOCK_MAX_S),
}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Lab, list[str]]]:
    with five_hosts(tmp_path, TIMINGS) as made:
        yield made


async def test_a_partition_past_the_reclaim_time_heals(lab: tuple[Lab, list[str]]) -> None:
    made, addresses = lab
    majority, minority = addresses[:3], addresses[3:]
    made.cut([0, 1, 2], [3, 4])
    try:

        async def sides_forgot_each_other() -> bool:
            listed = dict(zip(addresses, await views_of(addresses), strict=True))
            return all(
                not set(listed[a]) & set(other)
                for side, other in ((majority, minority), (minority, majority))
                for a in side
            )

        # suspicion, death and the reclaim time run on gossip rounds, slower on a busy machine
        await until(sides_forgot_each_other, "each side forgetting the other", 120, every_s=0.2)
        held_until = time.monotonic() + 2 * RECLAIM_S  # forgotten for a while, knocks backed off
        while time.monotonic() < held_until:
            status, body, _ = await ask(majority[0], "w3 w4", 4)
            assert status == 200, body
            status, body, _ = await ask(minority[0], "w1 w2", 4)
            assert status == 503 and "no live peer serves layers" in body["error"]["message"]
            await asyncio.sleep(1.0)
    finally:
        made.heal()
    started = time.monotonic()
    await until(lambda: all_see_all_alive(addresses), "one swarm after healing", 60, every_s=0.2)
    took = time.monotonic() - started
    print(f"one swarm {took:.1f} s after the network returned")
    assert took <= KNOCK_MAX_S + 5.0 + 5.0, took  # a knock's wait, a full sync, gossip
    for entry in minority:
        status, body, _ = await ask(entry, "w1 w2", 4)
        assert status == 200, body
