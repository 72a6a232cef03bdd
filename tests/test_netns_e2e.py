"""The swarm on real separate hosts: one node per network namespace on a bridge (harness/netns.py),
under 10% packet loss and a 3-versus-2 partition (tests/test_readme_recipe.py runs the real
model over links capped at 100 Mbit/s).

Nodes run the `lan` preset, as on a home network, with one change: a full sync every
`FULL_SYNC_S` seconds instead of 30, which bounds how long a healed partition takes to be seen.
Skipped, with the reason, where namespaces cannot be made (not root, no ip/tc/nft)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

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

FULL_SYNC_S = 5.0
TIMINGS = {"SWARM_MEMBERSHIP_PUSH_PULL_INTERVAL_S": str(FULL_SYNC_S)}


@pytest.fixture(scope="module")
def tiny_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, list[str]]]:
    with five_hosts(tmp_path_factory.mktemp("netns-tiny"), TIMINGS) as lab:
        yield lab


async def test_ten_percent_loss_for_half_a_minute_kills_no_node_and_loses_no_request(
    tiny_lab: tuple[Lab, list[str]],
) -> None:
    lab, addresses = tiny_lab
    lab.lose(10)
    try:
        seen: set[str] = set()
        answered = 0
        deadline = time.monotonic() + 30  # many suspicion timeouts (each a few seconds)
        rng = random.Random(0)
        while time.monotonic() < deadline:
            entry = addresses[rng.randrange(len(addresses))]
            status, body, _ = await ask(entry, f"w{rng.randrange(200)} w5 w9", 8)
            assert status == 200, body
            assert body["usage"]["completion_tokens"] > 0
            answered += 1
            for view in await views_of(addresses):
                seen |= set(view.values())
    finally:
        lab.heal()
    assert "dead" not in seen, seen
    assert answered >= 5


async def test_a_partition_fails_fast_where_layers_are_missing_and_heals(
    tiny_lab: tuple[Lab, list[str]],
) -> None:
    lab, addresses = tiny_lab
    majority, minority = addresses[:3], addresses[3:]
    cut_at = time.monotonic()
    lab.cut([0, 1, 2], [3, 4])
    try:

        async def sides_see_each_other_dead() -> bool:
            views = dict(zip(addresses, await views_of(addresses), strict=True))
            return all(
                views[a].get(b) == "dead"
                for side, other in ((majority, minority), (minority, majority))
                for a in side
                for b in other
            )

        await until(
            sides_see_each_other_dead, "each side declaring the other dead", 25, every_s=0.2
        )
        for entry in minority:
            status, body, took = await ask(entry, "w1 w2", 4)
            assert status == 503, body
            assert "no live peer serves layers" in body["error"]["message"], body
            assert took < 2.0
        served = 0
        while time.monotonic() - cut_at < 30:
            status, body, _ = await ask(majority[served % 3], "w3 w4", 4)
            assert status == 200, body
            served += 1
    finally:
        lab.heal()
    started = time.monotonic()
    await until(
        lambda: all_see_all_alive(addresses), "views agreeing after healing", 60, every_s=0.2
    )
    took = time.monotonic() - started
    assert took <= FULL_SYNC_S + 2.0, took
    status, body, _ = await ask(minority[0], "w1 w2", 4)
    assert status == 200, body
