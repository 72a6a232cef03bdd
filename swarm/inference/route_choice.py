"""The entry's route chooser: members' records and measured round trips in, a planned route
(hops and the expected time of a step through them) out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from swarm import placement
from swarm.errors import NoRouteError
from swarm.inference.remote import PlannedRoute, RouteChooser
from swarm.routing import Route, RouteQuery, find_route
from swarm.types import MemberRecord, NodeId


def route_chooser(
    records: Callable[[], Sequence[MemberRecord]],
    num_layers: int,
    round_trips: Callable[[], Mapping[NodeId, float]],
    kv_bytes_per_token_layer: int,
    standing: Callable[[], Sequence[MemberRecord]] | None = None,
) -> RouteChooser:
    """`records`: the members to route through (alive); `standing`: those that may serve
    again soon (alive or suspect), whose layers a request waits for rather than failing;
    `kv_bytes_per_token_layer`: what one token of a session takes in one layer's cache."""

    def choose(
        excluded: frozenset[NodeId],
        tokens: int,
        busy: Mapping[NodeId, int],
        own_work_ms: Mapping[NodeId, float],
    ) -> PlannedRoute:
        members = records()
        rtt = round_trips()
        leaving = frozenset(r.node_id for r in members if r.draining)
        kv = tokens * kv_bytes_per_token_layer
        last = RouteQuery(
            num_layers, exclude=excluded, rtt_ms=rtt, sessions=busy, own_work_ms=own_work_ms
        )
        staying = replace(last, exclude=excluded | leaving)
        route = _first_route(
            members,
            members if standing is None else standing(),
            # the strictest first: hops with room for the session's cache, no leaving node;
            replace(staying, kv_bytes_per_layer=kv),
            # then any room (a hop evicts idle sessions to make some, or says it is full);
            staying,
            # then a leaving node, when nothing else serves its layers yet (names the missing
            # layers when even this fails)
            last,
        )
        by_id = {r.node_id: r for r in members}
        prefill_ms_per_token = sum(
            len(h.span) * by_id[h.node_id].capacity.ms_per_layer_prefill for h in route.hops
        )
        return PlannedRoute(route.hops, route.cost_ms, prefill_ms_per_token)

    return choose


def _first_route(
    members: Sequence[MemberRecord], standing: Sequence[MemberRecord], *queries: RouteQuery
) -> Route:
    """The route of the first query that has one. When none has, the NoRouteError of the
    last names the missing layers and says whether they are only moving: the members can
    cover them (a plan is being carried out), or the standing ones can (a suspect that
    serves them refutes its suspicion, or is declared dead and a plan moves on)."""
    for query in queries[:-1]:
        try:
            return find_route(members, query)
        except NoRouteError:
            continue
    last = queries[-1]
    try:
        return find_route(members, last)
    except NoRouteError as e:
        moving = placement.can_cover(members, last.num_layers) or placement.can_cover(
            standing, last.num_layers
        )
        raise NoRouteError(str(e), e.missing, moving) from None
