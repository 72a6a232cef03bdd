"""The entry's route choice: a session goes to hops with room for its KV cache when there are
some, to any hop when there are none (a hop evicts idle sessions or says it is full), and
through a leaving node only when nothing else serves its layers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.factories import member
from swarm.errors import NoRouteError
from swarm.inference.route_choice import route_chooser
from swarm.types import MemberRecord, NodeId

KV_PER_TOKEN = 10  # bytes per token per layer


def _choose(members: list[MemberRecord], tokens: int, excluded: frozenset[str] = frozenset()):  # type: ignore[no-untyped-def]
    choose = route_chooser(lambda: members, 10, dict, KV_PER_TOKEN)
    return [h.node_id for h in choose(frozenset(NodeId(n) for n in excluded), tokens, {}, {}).hops]


@pytest.mark.parametrize(
    ("members", "tokens", "route"),
    [
        # a is faster, but 8 tokens x 10 layers x 10 bytes do not fit its 500 free bytes
        ([member("a", (0, 10), kv_free=500), member("b", (0, 10), ms=2.0, kv_free=800)], 8, ["b"]),
        ([member("a", (0, 10), kv_free=500), member("b", (0, 10), ms=2.0, kv_free=800)], 4, ["a"]),
        # nobody has room: the fastest, which will evict idle sessions or answer "full"
        ([member("a", (0, 10), kv_free=0), member("b", (0, 10), ms=2.0, kv_free=0)], 8, ["a"]),
        # a leaving node only when nothing else serves its layers
        ([replace(member("a", (0, 10)), draining=True), member("b", (0, 10), ms=3.0)], 1, ["b"]),
        ([replace(member("a", (0, 10)), draining=True), member("b", (0, 5))], 1, ["a"]),
    ],
)
def test_the_route_fits_the_session_where_it_can(
    members: list[MemberRecord], tokens: int, route: list[str]
) -> None:
    assert _choose(members, tokens) == route


def test_no_route_names_the_missing_layers() -> None:
    with pytest.raises(NoRouteError, match="5"):
        _choose([member("a", (0, 5))], 1)


def test_layers_only_a_suspect_serves_are_waited_for_not_refused() -> None:
    alive = [replace(member("a", (0, 5)), pinned=True)]  # it cannot take more layers
    suspect = replace(member("b", (5, 10)), pinned=True)
    choose = route_chooser(lambda: alive, 10, dict, KV_PER_TOKEN, lambda: [*alive, suspect])
    with pytest.raises(NoRouteError, match="5") as waited:
        choose(frozenset(), 1, {}, {})
    assert waited.value.moving  # the request waits for b to refute or be declared dead
    alone = route_chooser(lambda: alive, 10, dict, KV_PER_TOKEN, lambda: alive)
    with pytest.raises(NoRouteError) as refused:
        alone(frozenset(), 1, {}, {})
    assert not refused.value.moving  # nobody standing serves 5:10: 503 at once
