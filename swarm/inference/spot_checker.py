"""The entry's spot-checks, carried out (the decisions are `spot_checks.py`'s): a sampled
step's output compared with a shadow session's, replayed from position 0 through a route
that leaves one hop out, and with a third where the two differ. A shadow session has its own
id, so the live session's caches are never touched; it is closed on its hops once run. A
member convicted is asked to reload its layers (`ReloadLayers`, once per conviction)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import torch

from swarm.config import NetConfig
from swarm.errors import HopFailedError, NoRouteError
from swarm.inference.spot_checks import (
    Convictions,
    Outcome,
    Result,
    Tally,
    Verdict,
    check_every,
    check_order,
    sampled,
    third_route_excludes,
    verdict,
)
from swarm.types import MemberRecord, NodeId, SessionId
from swarm.wire import Hop, ReloadLayers

log = logging.getLogger(__name__)


class Routed(Protocol):
    @property
    def hops(self) -> tuple[Hop, ...]: ...


# the members a route leaves out -> the route (NoRouteError when there is none)
ShadowRoute = Callable[[frozenset[NodeId]], Routed]
# a shadow session, its route, every token so far embedded, the prompt's length -> the
# last position's output
RunShadow = Callable[[SessionId, Routed, torch.Tensor, int], Awaitable[torch.Tensor]]
# a convicted member's address and the request to send it (sent in the background)
AskReload = Callable[[str, ReloadLayers], None]


class SpotChecker:
    def __init__(
        self,
        config: NetConfig,
        shadow_route: ShadowRoute,
        run_shadow: RunShadow,
        standing: Callable[[], Sequence[MemberRecord]],
        ask_reload: AskReload,
    ) -> None:
        """`standing`: the members the view holds alive or suspect (a convicted one is let
        back in once it announces a reload, or has left that and come back: it started
        again); `ask_reload`: sends a convicted member the request to reload."""
        self._every = config.spot_check_every
        self._every_flagged = config.spot_check_every_flagged
        self._shadow_route = shadow_route
        self._run_shadow = run_shadow
        self._standing = standing
        self._ask_reload = ask_reload
        self.convictions = Convictions()
        self.tally = Tally()

    def sampled(self, session: SessionId, position: int, route: Sequence[Hop]) -> bool:
        """Whether the step of `session` at `position` through `route` is checked."""
        nodes = [hop.node_id for hop in route]
        every = check_every(nodes, self.convictions.flagged, self._every, self._every_flagged)
        return sampled(session, position, every)

    def convicted(self) -> frozenset[NodeId]:
        """The members left out of routes now (cheap when there are none)."""
        if not self.convictions.convicted:
            return frozenset()
        return self.convictions.current(self._reloads())

    def _reloads(self) -> dict[NodeId, int]:
        """The members the view holds alive or suspect, with the reloads each announces."""
        return {r.node_id: r.reloads for r in self._standing()}

    async def check(
        self,
        session: SessionId,
        route: tuple[Hop, ...],
        everything: torch.Tensor,
        prompt_tokens: int,
        output: torch.Tensor,
    ) -> Verdict:
        """Compare `output` (the live step's last position, [1, 1, hidden]) with a shadow
        run of `everything` (every token up to it, embedded) through a route without one of
        `route`'s hops, and with a third where they differ. Members a verdict names are
        convicted (left out of routes) or flagged (checked more often)."""
        position = everything.shape[1] - 1
        reloads = self._reloads()  # as the step ran: a reload since lifts what it shows
        live = Result(frozenset(h.node_id for h in route), _bits(output))
        nodes = [h.node_id for h in route]
        shadow = None
        for i in check_order(nodes, self.convictions.flagged, position):
            shadow = await self._run(frozenset({nodes[i]}), everything, prompt_tokens)
            if shadow is not None:
                break
        if shadow is None:
            self.tally.unchecked += 1
            return Verdict(Outcome.AGREE)
        self.tally.checks += 1
        results = [live, shadow]
        if live.output == shadow.output:
            return Verdict(Outcome.AGREE)
        self.tally.mismatches += 1
        third = await self._run(
            third_route_excludes(live.route, shadow.route), everything, prompt_tokens
        )
        results += [third] if third is not None else []
        found = verdict(results)
        self._act(found, session, position, reloads)
        return found

    async def _run(
        self, leave_out: frozenset[NodeId], everything: torch.Tensor, prompt_tokens: int
    ) -> Result | None:
        """A shadow run through a route without `leave_out` (nor convicted members); None
        when there is no such route or a hop of it failed."""
        try:
            route = self._shadow_route(leave_out | self.convicted())
        except NoRouteError:
            return None
        shadow = SessionId(uuid.uuid4().hex)
        try:
            out = await self._run_shadow(shadow, route, everything, prompt_tokens)
        except (HopFailedError, NoRouteError) as e:
            log.info("a spot-check's shadow run failed (%s); not counted", e)
            return None
        return Result(frozenset(h.node_id for h in route.hops), _bits(out[:, -1:]))

    def _act(
        self, found: Verdict, session: SessionId, position: int, reloads: dict[NodeId, int]
    ) -> None:
        members = ", ".join(sorted(found.members))
        if found.outcome is Outcome.CONVICTED:
            asked = [
                node
                for node in sorted(found.members)
                if self.convictions.convict(node, reloads.get(node, 0))
            ]
            for node in found.members:
                self.tally.wrong[node] = self.tally.wrong.get(node, 0) + 1
            log.error(
                "spot-check: member %s computed a wrong result (session %s, position %d; "
                "two routes without it agree); asked to reload its layers, and left out of "
                "routes until it has, or starts again",
                members,
                session,
                position,
            )
            self._ask(asked, ReloadLayers(session, position))
            return
        self.tally.undecided += 1
        self.convictions.flagged.update(found.members)
        log.warning(
            "spot-check: results differ at position %d of session %s and no third route "
            "decides; checking %s more often",
            position,
            session,
            members,
        )

    def _ask(self, nodes: Sequence[NodeId], request: ReloadLayers) -> None:
        """Ask each of `nodes` (newly convicted) to reload its layers from its store."""
        addresses = {r.node_id: r.address for r in self._standing()}
        for node in nodes:
            address = addresses.get(node)
            if address is None:  # gone from the view: a restart reloads it anyway
                continue
            self._ask_reload(address, request)
            self.tally.reloads_asked[node] = self.tally.reloads_asked.get(node, 0) + 1


def _bits(output: torch.Tensor) -> bytes:
    """The exact bytes of a step's output, whatever its dtype."""
    flat = output.detach().contiguous().view(-1)
    return flat.view(torch.uint8).cpu().numpy().tobytes()
