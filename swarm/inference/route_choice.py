"""The entry's route chooser: members' records and measured round trips in, a planned route
(hops and the expected time of a step through them) out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from swarm import placement
from swarm.errors import NoRouteError
from swarm.inference.remote import PlannedRoute, RouteChooser
from swarm.routing import RouteQuery, find_route
from swarm.types import MemberRecord, NodeId
from swarm.wire import Hop


def route_chooser(
    records: Callable[[], Sequence[MemberRecord]],
    num_layers: int,
    round_trips: Callable[[], Mapping[NodeId, float]],
) -> RouteChooser:
    def choose(excluded: frozenset[NodeId]) -> PlannedRoute:
        members = records()
        rtt = round_trips()
        leaving = frozenset(r.node_id for r in members if r.draining)
        try:  # a leaving node only when nothing else serves its layers yet
            query = RouteQuery(num_layers, exclude=excluded | leaving, rtt_ms=rtt)
            route = find_route(members, query)
        except NoRouteError:  # names the missing layers when this fails too
            try:
                route = find_route(members, RouteQuery(num_layers, exclude=excluded, rtt_ms=rtt))
            except NoRouteError as e:
                moving = placement.can_cover(members, num_layers)
                raise NoRouteError(str(e), e.missing, moving) from None
        by_id = {r.node_id: r for r in members}
        prefill_ms_per_token = sum(
            len(h.span) * by_id[h.node_id].capacity.ms_per_layer_prefill * by_id[h.node_id].slowdown
            for h in route.hops
        )
        hops = tuple(Hop(h.node_id, h.address, h.span) for h in route.hops)
        return PlannedRoute(hops, route.cost_ms, prefill_ms_per_token)

    return choose
