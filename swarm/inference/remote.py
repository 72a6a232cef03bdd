"""The entry side of a networked request: send each step to the first hop of the session's
route and wait for the last hop's result (or an error frame) under a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from swarm.config import NetConfig
from swarm.errors import (
    ActivationError,
    HopFailedError,
    LinkError,
    NoRouteError,
    PrefixMissingError,
)
from swarm.inference.ahead import NextStep, StepsAhead
from swarm.inference.pipeline import Prefilled
from swarm.inference.prompt_keys import (
    HopKey,
    KeptBlocks,
    block_digests,
    keeps_the_turn,
    reusable_blocks,
)
from swarm.inference.replay import replay
from swarm.inference.spot_checker import Routed, SpotChecker
from swarm.inference.spot_checks import Outcome
from swarm.inference.timeline import TimelineSums
from swarm.inference.waiters import Reply
from swarm.net.links import Links
from swarm.net.probes import RoundTrips
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.schema import FailoverReport, HopTimes, RequestTrace, RouteHop
from swarm.types import MemberRecord, NodeId, SessionId
from swarm.wire import (
    CloseSession,
    Codec,
    ErrorCode,
    ErrorMessage,
    Hop,
    Peer,
    ReloadLayers,
    ResultMessage,
    StepMessage,
)

log = logging.getLogger(__name__)

_SLOW_STEP_FACTOR = 4  # deadlines a step may take while every hop answers probes
_COVERAGE_POLL_S = 0.1  # seconds between looks at the view while layers are moving
_BAN_S = 5.0  # seconds a hop that failed a step is first left out of new routes
_BAN_MAX_S = 120.0  # seconds, the longest ban
_STRIKES_FORGOTTEN_S = 600.0  # seconds without failures after which a hop's record is clean
_ONE_FAILURE_S = 2.0  # seconds within which reports of one hop's failure are one strike

# (excluded peers, tokens the session holds, sessions this entry already routes through each
# node, ms of its own work per token on each node outside any hop) -> route
RouteChooser = Callable[
    [frozenset[NodeId], int, Mapping[NodeId, int], Mapping[NodeId, float]], "PlannedRoute"
]
# the incarnation of each member membership holds alive now
AliveMembers = Callable[[], Mapping[NodeId, int]]


@dataclass(frozen=True)
class PlannedRoute:
    """A route and what its steps are expected to cost, from the members' measured speeds."""

    hops: tuple[Hop, ...]
    decode_ms: float  # expected milliseconds of a one-token step through the whole route
    prefill_ms_per_token: float  # expected milliseconds per token of a prefill

    def expected_ms(self, tokens: int) -> float:
        return self.decode_ms if tokens <= 1 else self.prefill_ms_per_token * tokens


@dataclass
class Trace:
    """The route a session takes, the per-hop timings of its last step, and its re-routes."""

    route: PlannedRoute
    timings: tuple[HopTimes, ...] = ()
    failovers: list[FailoverReport] = field(default_factory=list)
    replaying: bool = False  # its steps replay the session on a new route, until it is rebuilt
    failed: set[NodeId] = field(default_factory=set)  # hops that failed this session
    leaving: set[NodeId] = field(default_factory=set)  # hops that refused it as they leave
    tokens: int = 0  # positions the session's caches hold after its last step
    timeline: TimelineSums = field(default_factory=TimelineSums)  # its decode steps, summed

    def report(self) -> RequestTrace:
        route = tuple(
            RouteHop(h.node_id, h.address, (h.span.start, h.span.end)) for h in self.route.hops
        )
        return RequestTrace(route, self.timings, tuple(self.failovers), self.timeline.report())


class RemotePipeline:
    def __init__(
        self,
        me: Peer,
        links: Links,
        ahead: StepsAhead,
        choose_route: RouteChooser,
        round_trips: RoundTrips,
        config: NetConfig,
        failures: asyncio.Queue[NodeId],
        chunk_tokens: int,
        alive: AliveMembers,
        head_ms_per_session: Callable[[], float] = lambda: 0.0,
        kept: KeptBlocks | None = None,
        *,
        standing: Callable[[], Sequence[MemberRecord]],
    ) -> None:
        """`chunk_tokens`: the longest prefill chunk (runtime.prefill_chunk_tokens);
        `head_ms_per_session`: what this node's head costs per session step (the compute
        thread's time), which it spends beside any hop it serves; `ahead`: the plain decode
        steps the compute thread sends as soon as the head sampled their token, whose step
        numbers and waiters this pipeline shares; `kept`: the prompt blocks this entry sent
        through each hop, where hops keep prompt blocks and start prompts from them
        (runtime.prompt_cache; None: they keep none); `standing`: the members membership holds
        alive or suspect, which spot-checks let a member they convicted back in from once it
        announces a reload, or has left and come back."""
        self._me = me
        self._links = links
        self._waiters = ahead.waiters
        self._choose_route = choose_route
        self._round_trips = round_trips
        self._config = config
        self._codec = Codec[config.activation_codec.upper()]
        self._chunk_tokens = chunk_tokens
        self._steps = ahead.steps
        self.ahead = ahead
        self.traces: dict[SessionId, Trace] = {}  # sessions in flight
        self._alive = alive
        self._head_ms_per_session = head_ms_per_session
        self.bans = Bans()
        # Hops this entry found failed, for membership to suspect; bounded, oldest kept.
        self.failures = failures
        self._background: set[asyncio.Task[None]] = set()
        self._keep_prompts = kept is not None
        self.kept = KeptBlocks() if kept is None else kept
        # what else shapes a block's bits at a hop: its size, how activations travel
        self._block_salt = f"{chunk_tokens}:{self._codec.name}"
        self.checks = SpotChecker(
            config, self._shadow_route, self._run_shadow, standing, self._ask_reload
        )

    async def prefill(
        self, session: SessionId, hidden: torch.Tensor, token_ids: Sequence[int] | None
    ) -> Prefilled:
        """See `Pipeline.prefill`. A hop that no longer keeps a block it was sent answers
        PREFIX_MISSING, and the prompt goes again whole, once."""
        if token_ids is None or not self._keep_prompts:
            return Prefilled(await self.forward(session, hidden, 0))
        size = self._chunk_tokens
        digests = block_digests(token_ids, size, self._block_salt)
        trace = self.traces.get(session)
        if trace is None:
            route = await self._choose(hidden.shape[1])
            trace = self.traces[session] = Trace(self._keeping(route, digests, hidden.shape[1]))
        hops = self._hop_keys(trace.route.hops)
        start = reusable_blocks(self.kept.held(hops, digests), hidden.shape[1], size) * size
        for _ in hops:  # each try learns what one more hop holds, fewer blocks each time
            try:
                out = await self._prefill_from(session, hidden, start, digests)
                break
            except PrefixMissingError as e:
                held = min(e.held, start // size - 1)
                log.info("session %s: %s; starting from %d blocks", session, e, held)
                for hop in hops:  # what that hop keeps of this prompt: what it said
                    if hop.node_id == e.node_id or e.node_id is None:
                        self.kept.forget(hop.node_id)
                        self.kept.sent([hop], digests[:held])
                start = max(0, held) * size
        else:
            start = 0
            out = await self._prefill_from(session, hidden, start, digests)
        self.kept.sent(hops, digests)
        return Prefilled(out, start)

    async def _prefill_from(
        self, session: SessionId, hidden: torch.Tensor, start: int, digests: Sequence[str]
    ) -> torch.Tensor:
        return await self.forward(
            session, hidden[:, start:], start, digests=digests, adopted=start // self._chunk_tokens
        )

    def _keeping(self, best: PlannedRoute, digests: Sequence[str], tokens: int) -> PlannedRoute:
        """The route for a new prompt: the fastest, or one through the nodes that keep more
        of its blocks where that one is not much slower (`keeps_the_turn`), so that where
        several nodes serve the same layers a conversation's turns stay with their blocks."""
        if not digests:
            return best
        holders = self.kept.holders(digests[0])
        if not holders or {h.node_id for h in best.hops} <= holders:
            return best
        alive = self._alive()
        others = (frozenset(alive) - holders) | self.bans.current(alive) | self.checks.convicted()
        own = self._own_work()
        try:
            kept = self._choose_route(others, tokens, self._sessions_through(), own)
        except NoRouteError:
            return best
        best_blocks = self.kept.held(self._hop_keys(best.hops), digests)
        kept_blocks = self.kept.held(self._hop_keys(kept.hops), digests)
        if keeps_the_turn(best.decode_ms, best_blocks, kept.decode_ms, kept_blocks):
            return kept
        return best

    @staticmethod
    def _hop_keys(hops: Sequence[Hop]) -> list[HopKey]:
        return [HopKey(h.node_id, h.span) for h in hops]

    async def forward(
        self,
        session: SessionId,
        hidden: torch.Tensor,
        position: int,
        verify: bool = False,
        *,
        digests: Sequence[str] = (),
        adopted: int = 0,
        every_row: bool = False,
    ) -> torch.Tensor:
        """See `Pipeline.forward`. A prompt's step (from `prefill`) names its blocks: the
        first `adopted` of `digests` the hops start the session from, and each whole chunk
        sent is kept under its own. `every_row`: each chunk's result carries every position,
        and the step returns them all, in order."""
        trace = self.traces.get(session)
        if trace is None:
            trace = self.traces[session] = Trace(await self._choose(position + hidden.shape[1]))
        route = trace.route.hops
        convicted = self.checks.convicted()
        wrong = next((h.node_id for h in route if h.node_id in convicted), None)
        if wrong is not None:  # a spot-check found it wrong since the route was chosen
            raise _wrong_result(trace, wrong, 0.0)
        plain = not verify and hidden.shape[1] == 1 and not trace.replaying
        ahead = self.ahead.take(session, position) if plain else None
        if not plain:
            self.ahead.cancel(session)
        chunks = [(hidden, position)] if verify else self._chunks(hidden, position)
        steps = [ahead.step] if ahead else [next(self._steps) for _ in chunks]
        replies = [ahead.reply] if ahead else [self._waiters.expect(session, s) for s in steps]
        sent = time.monotonic()
        began = time.perf_counter() if ahead is None else ahead.sent_at
        try:
            watches = {await self._watch(hop): hop for hop in route}
            if plain:  # the head may send the next step as soon as it has this one's token
                self.ahead.plan(session, NextStep(route, self._me, self._codec, position + 1))
            sending = time.perf_counter()
            early: Reply | None = None  # a chunk before the last that failed
            if ahead is None:
                size = self._chunk_tokens
                for i, (step, (part, at)) in enumerate(zip(steps, chunks, strict=True)):
                    if i and part.shape[1] == 1:
                        # a one-row chunk runs where decode steps run at each hop, which
                        # may take it before prefill chunks still waiting there: it leaves
                        # once the chunk before it has come back
                        early = await self._await_reply(
                            session, steps[i - 1], replies[i - 1], watches, trace, size
                        )
                        if isinstance(early, ErrorMessage):
                            break
                        early = None
                    whole = part.shape[1] == size and at % size == 0 and at // size < len(digests)
                    message = StepMessage(
                        session,
                        step,
                        at,
                        part,
                        route,
                        self._me,
                        (),
                        self._codec,
                        verify,
                        tuple(digests[:adopted]) if i == 0 else (),
                        digests[at // size] if whole else "",
                        every_row,
                    )
                    deadline_s = self._deadline_s(trace, part.shape[1])
                    await self._send_within(route[0], message, deadline_s)
            send_ms = ahead.send_ms if ahead else (time.perf_counter() - sending) * 1000
            reply = early or await self._await_reply(
                session, steps[-1], replies[-1], watches, trace, hidden.shape[1]
            )
            earlier = (
                [
                    await self._await_reply(session, s, r, watches, trace, self._chunk_tokens)
                    for s, r in zip(steps[:-1], replies[:-1], strict=True)
                ]
                if every_row and not isinstance(reply, ErrorMessage)
                else []
            )
            resumed = time.perf_counter()
            decoded_at = self._waiters.decoded_at(session, steps[-1])
            # a chunk that failed makes the ones after it fail too: report the first
            failed = [r.result() for r in replies[:-1] if r.done()]
            reply = next((r for r in failed if isinstance(r, ErrorMessage)), reply)
            if isinstance(reply, ErrorMessage) and reply.code is ErrorCode.PREFIX_MISSING:
                held = reply.held or 0
                raise PrefixMissingError(
                    f"hop {reply.failed_hop}: {reply.reason}", held, reply.failed_hop
                )
            if isinstance(reply, ErrorMessage):
                # a hop that moved its span or is leaving is healthy: re-route, no ban
                culprit = reply.failed_hop
                if reply.code in (ErrorCode.WRONG_SPAN, ErrorCode.LEAVING):
                    culprit = None
                if reply.code is ErrorCode.LEAVING and reply.failed_hop is not None:
                    trace.leaving.add(reply.failed_hop)
                raise HopFailedError(f"hop {reply.failed_hop} failed: {reply.reason}", culprit)
        except HopFailedError as e:
            trace.failovers.append(
                FailoverReport(
                    e.node_id, str(e), time.time(), (time.monotonic() - sent) * 1000, None, 0
                )
            )
            raise self._naming_missing(e, trace) from None
        finally:
            for step in steps:
                self._waiters.forget(session, step)
        if hidden.shape[1] == 1 and not trace.replaying:
            resume_ms = 0.0 if decoded_at is None else (resumed - decoded_at) * 1000
            step_ms = (resumed - began) * 1000
            trace.timeline.add_step(reply.timings, step_ms, send_ms, resume_ms)
        trace.timings = reply.timings
        trace.tokens = position + hidden.shape[1]
        if every_row:
            return _every_row([*earlier, reply], hidden.shape[1])
        return reply.hidden if reply.verify or not verify else reply.hidden[:, -1:]

    async def prefill_rows(self, session: SessionId, hidden: torch.Tensor) -> torch.Tensor:
        return await self.forward(session, hidden, 0, every_row=True)

    async def replay(
        self, session: SessionId, hidden: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        """See `Pipeline.replay`; the failover's report gets what the whole replay took."""
        started = time.monotonic()
        out = await replay(self.forward, session, hidden, prefilled, self._chunk_tokens)
        trace = self.traces.get(session)
        if trace is not None:
            trace.replaying = False
            if trace.failovers:
                trace.failovers[-1] = dataclasses.replace(
                    trace.failovers[-1],
                    replay_ms=(time.monotonic() - started) * 1000,
                    replay_tokens=hidden.shape[1],
                )
        return out

    def spot_checked(self, session: SessionId, position: int) -> bool:
        """See `Pipeline.spot_checked`."""
        trace = self.traces.get(session)
        return self.checks.sampled(session, position, () if trace is None else trace.route.hops)

    async def spot_check(
        self, session: SessionId, everything: torch.Tensor, prefilled: int, output: torch.Tensor
    ) -> None:
        """See `Pipeline.spot_check`: a convicted hop of the session's route fails the step
        as a failed hop does, with a failover in its trace."""
        trace = self.traces.get(session)
        if trace is None or trace.replaying:
            return
        started = time.monotonic()
        found = await self.checks.check(session, trace.route.hops, everything, prefilled, output)
        if found.outcome is not Outcome.CONVICTED:
            return
        wrong = next((h.node_id for h in trace.route.hops if h.node_id in found.members), None)
        if wrong is None:  # the shadow's route was wrong: the live step is right
            return
        raise _wrong_result(trace, wrong, (time.monotonic() - started) * 1000)

    def _shadow_route(self, leave_out: frozenset[NodeId]) -> PlannedRoute:
        """A route for a spot-check's shadow run: without `leave_out`, banned or leaving
        members (NoRouteError when there is none)."""
        alive = self._alive()
        leaving = frozenset().union(*(t.leaving for t in self.traces.values()))
        excluded = leave_out | self.bans.current(alive) | leaving
        return self._choose_route(excluded, 1, self._sessions_through(), self._own_work())

    async def _run_shadow(
        self, shadow: SessionId, route: Routed, everything: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        """`everything` replayed as a session of its own through `route`, then closed."""
        planned = route if isinstance(route, PlannedRoute) else PlannedRoute(route.hops, 0, 0)
        self.traces[shadow] = Trace(planned, replaying=True)
        try:
            return await replay(self.forward, shadow, everything, prefilled, self._chunk_tokens)
        finally:
            await self.close(shadow)

    def _naming_missing(self, error: HopFailedError, trace: Trace) -> HopFailedError:
        """The failure, naming the layers no member but the failed hops serves: what the
        client reads when the stream ends on it."""
        gone = {*trace.failed, *([error.node_id] if error.node_id is not None else [])}
        if not gone:
            return error
        try:
            self._choose_route(frozenset(gone), 1, {}, {})
        except NoRouteError as e:
            return HopFailedError(f"{error}; without it {e}", error.node_id)
        return error

    def _chunks(self, hidden: torch.Tensor, position: int) -> list[tuple[torch.Tensor, int]]:
        """A long prefill travels as consecutive chunks, each a step of its own, so the next
        hop computes chunk i while this one computes chunk i + 1. Every hop runs a session's
        steps in the order they arrive, so its cache grows as from one step; only the last
        chunk's result is the step's."""
        return [
            (hidden[:, start:end], position + start)
            for start, end in prefill_chunks(hidden.shape[1], self._chunk_tokens, position)
        ]

    async def _watch(self, hop: Hop) -> asyncio.Future[None]:
        try:
            return await self._links.watch(hop.address)
        except LinkError as e:
            raise HopFailedError(str(e), hop.node_id) from None

    async def _send(self, hop: Hop, message: StepMessage) -> None:
        try:
            await self._links.send(hop.address, message)
        except LinkError as e:
            raise HopFailedError(str(e), hop.node_id) from None

    async def _send_within(self, hop: Hop, message: StepMessage, deadline_s: float) -> None:
        """Send the step to the route's first hop. A frozen hop reads nothing, so once its
        socket's buffers fill a send waits for the link's send_timeout_s (10 s); a frame that
        has not left by the step's deadline makes the hop answer a probe or be taken as
        failed. The send itself is never cut short (half a frame would break the link): it
        goes on in the background and drops the link when its own timeout ends."""
        if self._links.send_now(hop.address, message):  # no task or timer for a decode step
            return
        sending = asyncio.ensure_future(self._send(hop, message))
        done, _ = await asyncio.wait({sending}, timeout=deadline_s)
        if not done:
            self._background.add(sending)
            sending.add_done_callback(_forget_send)
            sending.add_done_callback(self._background.discard)
            if await self._silent((hop,)):
                raise HopFailedError(
                    f"a step for hop {hop.node_id} did not leave in {deadline_s:.1f} s "
                    "and the hop does not answer",
                    hop.node_id,
                )
        await sending

    def _deadline_s(self, trace: Trace, tokens: int) -> float:
        """How long a step of `tokens` positions may take before its hops are probed."""
        config = self._config
        expected_s = trace.route.expected_ms(tokens) / 1000
        return max(config.step_deadline_floor_s, config.step_deadline_factor * expected_s)

    async def _await_reply(
        self,
        session: SessionId,
        step: int,
        reply: asyncio.Future[Reply],
        watches: dict[asyncio.Future[None], Hop],
        trace: Trace,
        tokens: int,
    ) -> Reply:
        """The step's reply, or HopFailedError naming the culprit: a hop whose link dropped,
        or, once the step is late, a hop that does not answer a probe."""
        config = self._config
        deadline_s = self._deadline_s(trace, tokens)
        # a long prefill on a busy machine may take longer than the flat bound and still be
        # on its way: the bound grows with what the step is expected to take
        limit_s = max(config.step_timeout_s, _SLOW_STEP_FACTOR * deadline_s)
        waited = 0.0
        while True:
            wait_s = min(deadline_s, limit_s - waited)
            pending: set[asyncio.Future[Any]] = {reply, *watches}
            done, _ = await asyncio.wait(
                pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            if reply in done:
                return reply.result()
            if self._waiters.claimed(session, step):
                # the result is here and the head runs on it on the compute thread: the step
                # is answered, whatever its deadline or its hops' links say since
                return await reply
            for dropped in done:
                hop = watches[cast("asyncio.Future[None]", dropped)]
                raise HopFailedError(f"the link to hop {hop.node_id} dropped", hop.node_id)
            waited += wait_s
            silent = await self._silent(trace.route.hops)
            if silent:
                raise HopFailedError(
                    f"step {step} is {waited:.1f} s late and hop {silent[0]} does not answer",
                    silent[0],
                )
            if waited >= limit_s:
                raise HopFailedError(f"step {step} got no answer in {waited:.1f} s")
            log.info("step %d is %.1f s late; every hop answers, waiting on", step, waited)

    async def _silent(self, hops: tuple[Hop, ...]) -> list[NodeId]:
        """The hops that do not answer a probe in time, in route order."""
        timeout_s = self._config.probe_timeout_s
        answers = await asyncio.gather(
            *(self._round_trips.answers(h.node_id, h.address, timeout_s) for h in hops)
        )
        return [hop.node_id for hop, ok in zip(hops, answers, strict=True) if not ok]

    def record_head(self, session: SessionId, ms: float, within_step: bool = False) -> None:
        trace = self.traces.get(session)
        if trace is not None:
            trace.timeline.add_head(ms, within_step)

    async def recover(self, session: SessionId, failed: NodeId | None) -> None:
        """Ban the failed hop (longer each time it fails again), tell membership, choose the
        new route at once, and drop the session from the old hops the new route leaves out.
        Hops kept on the new route rewind their caches when the replay arrives at position 0.
        NoRouteError when no route is left."""
        self.ahead.cancel(session)
        trace = self.traces.get(session)
        # never ban itself; a member a spot-check convicted is alive and left out already
        wrong = failed in self.checks.convicted()
        if failed is not None and failed != self._me.node_id and not wrong:
            self.bans.add(failed, self._alive().get(failed))
            with contextlib.suppress(asyncio.QueueFull):
                self.failures.put_nowait(failed)
            if trace is not None:
                trace.failed.add(failed)
        tokens = 1 if trace is None else trace.tokens + 1
        avoid = frozenset() if trace is None else frozenset(trace.failed)
        leaving = frozenset() if trace is None else frozenset(trace.leaving)
        new_route = await self._choose(tokens, avoid, leaving)
        if trace is None:
            return
        if wrong and failed is not None:
            trace.failed.add(failed)
        kept = {hop.node_id for hop in new_route.hops}
        for hop in trace.route.hops:
            if hop.node_id != failed and hop.node_id not in kept:
                self._spawn(self._close_on(hop, session))
        trace.route = new_route
        trace.replaying = True

    async def _choose(
        self,
        tokens: int,
        avoid: frozenset[NodeId] = frozenset(),
        leaving: frozenset[NodeId] = frozenset(),
    ) -> PlannedRoute:
        """A route that avoids `avoid` (hops that failed this session) and `leaving` (hops
        that refused it as they leave), waiting up to net.coverage_wait_s while layers are
        only moving between nodes: a leaving hop's layers are, until this entry's view holds
        the members that take them over."""
        deadline = time.monotonic() + self._config.coverage_wait_s
        waiting = False
        while True:
            try:
                return self._choose_now(tokens, avoid, leaving)
            except NoRouteError as e:
                if not e.moving or time.monotonic() >= deadline:
                    raise
                if not waiting:
                    waiting = True
                    log.info("%s; waiting for the nodes that take them over", e)
            await asyncio.sleep(_COVERAGE_POLL_S)

    def _choose_now(
        self, tokens: int, avoid: frozenset[NodeId], leaving: frozenset[NodeId] = frozenset()
    ) -> PlannedRoute:
        """A route around `leaving`, banned hops and the hops that failed this session
        (`avoid`). A hop that said it leaves is never tried again for the session. When
        none is left, a route through the banned hops that membership holds alive, and then
        through this session's failed hops that it holds alive too: a ban and a failed step
        are this entry's suspicion (a hop too busy to answer a probe in time looks failed),
        membership decides who is suspect or dead, and those are never tried again. A live
        hop that is the only one serving its layers is worth one more try, not a request
        that waits for layers no one is moving."""
        alive = self._alive()
        banned = self.bans.current(alive)
        busy = self._sessions_through()
        own = self._own_work()
        # a convicted member computes wrong text: never worth another try
        never = leaving | self.checks.convicted()
        exclusions = [e | never for e in _relaxed_exclusions(avoid, banned, frozenset(alive))]
        for excluded, looser in itertools.pairwise(exclusions):
            try:
                return self._choose_route(excluded, tokens, busy, own)
            except NoRouteError:
                log.warning("no route without %s; trying them again", sorted(excluded - looser))
        return self._choose_route(exclusions[-1], tokens, busy, own)

    def _own_work(self) -> dict[NodeId, float]:
        """What this entry's heads cost its own node per token, outside any hop: every
        session it is the entry of, whatever their routes."""
        return {self._me.node_id: len(self.traces) * self._head_ms_per_session()}

    def _sessions_through(self) -> Counter[NodeId]:
        """How many of this entry's sessions in flight each node serves a hop of. Sessions
        that start together all see the same gossiped loads; counting the ones already
        placed spreads them over replicas instead of sending every one down the same route."""
        counts: Counter[NodeId] = Counter()
        for trace in self.traces.values():
            counts.update({hop.node_id for hop in trace.route.hops})
        return counts

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _ask_reload(self, address: str, request: ReloadLayers) -> None:
        """Send a member a spot-check convicted the request to reload its layers, in the
        background: the stream the check stopped goes on meanwhile."""
        self._spawn(self._send_reload(address, request))

    async def _send_reload(self, address: str, request: ReloadLayers) -> None:
        try:
            await self._links.send(address, request)
        except LinkError as e:
            log.info("could not ask %s to reload its layers: %s", address, e)

    async def _close_on(self, hop: Hop, session: SessionId) -> None:
        try:
            await self._links.send(hop.address, CloseSession(session))
        except LinkError as e:
            log.info("could not close session %s on %s: %s", session, hop.node_id, e)

    async def close(self, session: SessionId) -> RequestTrace | None:
        self.ahead.cancel(session)
        trace = self.traces.pop(session, None)
        if trace is None:
            return None
        for hop in trace.route.hops:
            await self._close_on(hop, session)
        return trace.report()


class Bans:
    """Hops that failed a step, left out of new routes for a while: _BAN_S the first time,
    doubling with each failure that follows within _STRIKES_FORGOTTEN_S, up to _BAN_MAX_S.
    One failure is one strike however many sessions saw it: reports of the same hop within
    _ONE_FAILURE_S of its last strike count once. A ban is lifted early once membership holds
    the hop alive under a higher incarnation than when it failed: it refuted the suspicion
    the failure raised, or it restarted and joined again."""

    def __init__(self) -> None:
        self._until: dict[NodeId, float] = {}  # monotonic time each ban ends
        self._strikes: dict[NodeId, tuple[int, float]] = {}  # failures, time of the last
        self._incarnation: dict[NodeId, int] = {}  # the hop's incarnation when it failed

    def add(self, node: NodeId, incarnation: int | None) -> None:
        """`incarnation`: the hop's as membership holds it alive now, None when it does not."""
        now = time.monotonic()
        strikes, last = self._strikes.get(node, (0, now))
        if strikes and now - last < _ONE_FAILURE_S:
            return  # the same failure, seen by another session
        if now - last > _STRIKES_FORGOTTEN_S:
            strikes = 0
        self._strikes[node] = (strikes + 1, now)
        self._until[node] = now + min(_BAN_MAX_S, _BAN_S * 2**strikes)
        self._incarnation[node] = -1 if incarnation is None else incarnation

    def current(self, alive: Mapping[NodeId, int]) -> frozenset[NodeId]:
        """The hops banned now; `alive`: each live member's incarnation, from membership."""
        now = time.monotonic()
        self._until = {
            node: until
            for node, until in self._until.items()
            if until > now and alive.get(node, -1) <= self._incarnation[node]
        }
        self._incarnation = {n: i for n, i in self._incarnation.items() if n in self._until}
        return frozenset(self._until)


def _relaxed_exclusions(
    avoid: frozenset[NodeId], banned: frozenset[NodeId], alive: frozenset[NodeId]
) -> tuple[frozenset[NodeId], ...]:
    """The hops a route leaves out, strictest first: every banned hop and every hop that
    failed this session; then only the banned ones membership no longer holds alive; then
    only the failed or banned ones it no longer holds alive. A step that would exclude no
    fewer hops than the one before it is left out (it could not find another route)."""
    steps = (avoid | banned, avoid | (banned - alive), (avoid | banned) - alive)
    kept = [steps[0]]
    for step in steps[1:]:
        if step < kept[-1]:
            kept.append(step)
    return tuple(kept)


def _every_row(replies: Sequence[Reply], rows: int) -> torch.Tensor:
    """Every chunk's rows in order: the step's every position, [1, rows, hidden]."""
    out = torch.cat([cast(ResultMessage, r).hidden for r in replies], dim=1)
    if out.shape[1] != rows:  # a last hop of a version that returns the last position only
        raise ActivationError(
            f"a step of {rows} positions came back with {out.shape[1]}: a hop does not return "
            "every position (a node of an older version)"
        )
    return out


def _wrong_result(trace: Trace, wrong: NodeId, waited_ms: float) -> HopFailedError:
    """The failure of a session whose route goes through a member a spot-check convicted,
    recorded in its trace as a failover is."""
    error = HopFailedError(f"hop {wrong} computed a wrong result (spot-check)", wrong)
    trace.failovers.append(FailoverReport(wrong, str(error), time.time(), waited_ms, None, 0))
    return error


def _forget_send(sending: asyncio.Future[None]) -> None:
    """A send the step gave up on: its failure is the step's, already reported."""
    if not sending.cancelled():
        sending.exception()
