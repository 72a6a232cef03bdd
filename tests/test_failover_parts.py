"""The pieces of failover that need no cluster: bans with backoff, the leaving node's cover
check, a hop's de-duplication of steps, and the draining flag on the wire."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest

from harness.factories import member
from swarm.errors import NoRouteError
from swarm.inference import remote
from swarm.inference.hop_ledger import HopLedger
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.placement import covered_by_others
from swarm.runtime.execution.serving import Serving
from swarm.telemetry import SpeedMeter, StepCost
from swarm.types import LayerSpan, MemberRecord, NodeId, SessionId
from swarm.wire.fields import Fields

MS = 0.5  # each member's pace (ms per layer per token) where a pipeline chooses routes


def test_a_ban_doubles_with_each_failure_and_ends() -> None:
    bans = remote.Bans()
    now = 1000.0
    alive = {NodeId("x"): 3}
    with mock.patch("time.monotonic", lambda: now):
        bans.add(NodeId("x"), 3)
        for _ in range(7):  # the same failure, seen by seven more sessions: one strike
            bans.add(NodeId("x"), 3)
        assert bans.current(alive) == {"x"}
        now += remote._BAN_S + 0.1
        assert bans.current(alive) == frozenset()
        bans.add(NodeId("x"), 3)  # a second failure soon after: banned twice as long
        now += remote._BAN_S + 0.1
        assert bans.current(alive) == {"x"}
        now += remote._BAN_S
        assert bans.current(alive) == frozenset()
        now += remote._STRIKES_FORGOTTEN_S + 1  # a long clean record forgives
        bans.add(NodeId("x"), 3)
        now += remote._BAN_S + 0.1
        assert bans.current(alive) == frozenset()


@pytest.mark.parametrize(
    ("banned_at", "later", "lifted"),
    [
        (3, {}, False),  # suspect or dead: not in the alive members
        (3, {"x": 3}, False),  # alive, but nothing new heard from it
        (3, {"x": 4}, True),  # refuted the suspicion under a higher incarnation
        (None, {}, False),  # already suspect when it failed
        (None, {"x": 7}, True),  # alive again: refuted or joined again
    ],
)
def test_a_ban_is_lifted_when_membership_sees_the_hop_refute_or_rejoin(
    banned_at: int | None, later: dict[str, int], lifted: bool
) -> None:
    bans = remote.Bans()
    bans.add(NodeId("x"), banned_at)
    assert bans.current({NodeId(k): v for k, v in later.items()}) == (
        frozenset() if lifted else {"x"}
    )


@pytest.mark.parametrize(
    ("others", "covered"),
    [
        ([member("b", (0, 15))], True),
        ([member("b", (0, 10))], False),
        ([member("b", (0, 10)), member("c", (10, 30))], True),
        ([member("b", (0, 15), draining=True), member("c", (20, 30))], False),  # b leaves too
        ([member("b", (0, 15), draining=True)], True),  # nobody stays: nothing to wait for
        ([], True),
    ],
)
def test_a_leaving_node_waits_for_members_that_stay_to_cover_its_layers(
    others: list,
    covered: bool,  # type: ignore[type-arg]
) -> None:
    me = member("a", (0, 15), draining=True)
    assert covered_by_others(me.span, [me, *others], me.node_id) is covered


def test_draining_travels_in_the_member_record() -> None:
    for draining in (False, True):
        sent = member("a", (0, 15), draining=draining)
        assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent


def test_a_hop_runs_each_step_of_a_session_once_and_never_an_older_one() -> None:
    ledger = HopLedger(NodeId("me"), SpeedMeter(1.0, StepCost(0.0, 1.0, 0.0)))
    step = mock.Mock(session=SessionId("s"))
    for number, fresh in [(3, True), (3, False), (2, False), (9, True), (4, False)]:
        step.step = number
        assert ledger.is_new(step) is fresh


@pytest.mark.parametrize(("failures", "delivered"), [(0, True), (2, True), (3, False)])
async def test_a_hop_tries_again_to_return_a_result_its_entry_did_not_take(
    failures: int, delivered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a link to the entry that a lost packet kept from opening: the entry waits for the
    # result (up to net.step_timeout_s while every hop answers), so the hop tries again
    import torch

    from swarm.errors import LinkError
    from swarm.inference import hop_core
    from swarm.wire import ResultMessage

    monkeypatch.setattr(hop_core, "_RESULT_RETRY_S", 0.0)
    sent: list[ResultMessage] = []

    class FlakyLinks:
        left = failures

        async def send(self, address: str, message: ResultMessage) -> None:
            assert address == "entry:1"
            if self.left:
                self.left -= 1
                raise LinkError("cannot reach entry:1")
            sent.append(message)

    ledger = HopLedger(NodeId("me"), SpeedMeter(1.0, StepCost(0.0, 1.0, 0.0)))
    core = hop_core.HopCore(NodeId("me"), Serving(), FlakyLinks(), ledger)  # type: ignore[arg-type]
    step = mock.Mock(session=SessionId("s"), step=4, entry=mock.Mock(address="entry:1"))
    result = ResultMessage(SessionId("s"), 4, 7, torch.zeros(1, 1, 8))
    await core.send(hop_core.Departure(step, result, 0.0))
    assert sent == ([result] if delivered else [])


def _pipeline(
    records: list[MemberRecord], suspects: frozenset[str] = frozenset(), head_ms: float = 0.0
) -> remote.RemotePipeline:
    import asyncio
    import itertools

    from swarm.config import NetConfig
    from swarm.inference.ahead import StepsAhead
    from swarm.inference.route_choice import route_chooser
    from swarm.inference.waiters import StepWaiters
    from swarm.net.links import Links
    from swarm.net.probes import RoundTrips
    from swarm.wire import FrameCodec, Peer, SwarmKeys

    config = NetConfig(coverage_wait_s=5.0)
    me = Peer(NodeId("entry"), "127.0.0.1:1")
    links = Links(FrameCodec(SwarmKeys.loopback().frame, me.node_id), config)
    chooser = route_chooser(lambda: records, 30, dict, 0)
    failures: asyncio.Queue[NodeId] = asyncio.Queue()

    def alive() -> dict[NodeId, int]:
        return {r.node_id: r.incarnation for r in records if r.node_id not in suspects}

    round_trips = RoundTrips(me, links, config, 4096)
    ahead = StepsAhead(StepWaiters(), itertools.count(), asyncio.get_running_loop())
    return remote.RemotePipeline(
        me,
        links,
        ahead,
        chooser,
        round_trips,
        config,
        failures,
        chunk_tokens=256,
        alive=alive,
        head_ms_per_session=lambda: head_ms,
        standing=lambda: records,
    )


@pytest.mark.parametrize("suspect", [False, True])
async def test_when_only_banned_hops_are_left_the_route_tries_them_unless_membership_suspects_them(
    suspect: bool,
) -> None:
    only = member("n1", (0, 30), ms=MS)
    pipeline = _pipeline([only], frozenset({"n1"}) if suspect else frozenset())
    pipeline.bans.add(only.node_id, only.incarnation)
    if suspect:
        with pytest.raises(NoRouteError, match="0:30"):
            pipeline._choose_now(1, frozenset())
    else:
        assert [hop.node_id for hop in pipeline._choose_now(1, frozenset()).hops] == ["n1"]


@pytest.mark.parametrize("suspect", [False, True])
async def test_a_hop_that_failed_the_session_is_tried_again_when_it_alone_serves_its_layers(
    suspect: bool,
) -> None:
    # a hop too busy to answer a probe in time failed the step, and no other serves layers
    # 0:15: while membership holds it alive the session tries it again instead of waiting
    # for layers no one moves
    busy = member("n1", (0, 15), ms=MS)
    rest = member("n2", (15, 30), ms=MS)
    pipeline = _pipeline([busy, rest], frozenset({"n1"}) if suspect else frozenset())
    pipeline.bans.add(busy.node_id, busy.incarnation)
    if suspect:
        with pytest.raises(NoRouteError, match="0:15"):
            pipeline._choose_now(1, frozenset({busy.node_id}))
    else:
        route = pipeline._choose_now(1, frozenset({busy.node_id}))
        assert [hop.node_id for hop in route.hops] == ["n1", "n2"]


def _ids(*names: str) -> frozenset[NodeId]:
    return frozenset(NodeId(n) for n in names)


@pytest.mark.parametrize(
    ("avoid", "banned", "alive", "expected"),
    [
        # nothing to relax: one try
        ((), (), ("a", "b"), [()]),
        # a banned hop alive: tried again; a failed one alive: tried again last
        ((), ("a",), ("a",), [("a",), ()]),
        (("a",), (), ("a",), [("a",), ()]),
        (("a",), ("b",), ("a", "b"), [("a", "b"), ("a",), ()]),
        # the same hop failed and banned: one relaxation
        (("a",), ("a",), ("a",), [("a",), ()]),
        # hops membership does not hold alive stay out
        (("a",), ("b",), (), [("a", "b")]),
        (("a", "c"), ("b",), ("b", "c"), [("a", "b", "c"), ("a", "c"), ("a",)]),
    ],
)
def test_route_exclusions_relax_from_the_strictest_to_the_hops_membership_holds_alive(
    avoid: tuple[str, ...],
    banned: tuple[str, ...],
    alive: tuple[str, ...],
    expected: list[tuple[str, ...]],
) -> None:
    steps = remote._relaxed_exclusions(_ids(*avoid), _ids(*banned), _ids(*alive))
    assert list(steps) == [_ids(*step) for step in expected]


async def test_a_request_waits_for_layers_that_are_moving_and_fails_at_once_on_a_real_gap() -> None:
    import asyncio

    first = member("n1", (0, 15), ms=MS)
    second = member("n2", ms=MS)  # loading 15:30, not announced yet
    records = [first, second]
    pipeline = _pipeline(records)

    async def announce_later() -> None:
        await asyncio.sleep(0.5)
        records[1] = replace(second, span=LayerSpan(15, 30), incarnation=1)

    async with asyncio.timeout(10), asyncio.TaskGroup() as group:
        group.create_task(announce_later())
        route = await pipeline._choose(1)
    assert [hop.span for hop in route.hops] == [LayerSpan(0, 15), LayerSpan(15, 30)]

    # members whose memory cannot hold layers 15:30: no plan covers them, no waiting
    small = replace(first.capacity, layer_memory_bytes=15 * first.capacity.bytes_per_layer)
    records[:] = [replace(first, capacity=small)]
    started = asyncio.get_running_loop().time()
    with pytest.raises(NoRouteError, match="15:30") as refused:
        await pipeline._choose(1)
    assert not refused.value.moving
    assert asyncio.get_running_loop().time() - started < 0.5


async def test_a_hop_that_refused_the_session_as_it_leaves_is_not_tried_again_for_it() -> None:
    """The leaving hop judged its layers covered by its own view; this entry's view has not
    yet seen the member that takes them over. A session it refused waits for that member
    instead of asking the leaving hop again (which would refuse it again at once)."""
    import asyncio

    leaving = member("n1", (0, 30), ms=MS)
    taker = member("n2", ms=MS)  # taking 0:30 over, not announced yet
    records = [leaving, taker]
    pipeline = _pipeline(records)
    session = SessionId("s")
    pipeline.traces[session] = remote.Trace(await pipeline._choose(1))
    pipeline.traces[session].leaving.add(leaving.node_id)

    async def announce_later() -> None:
        await asyncio.sleep(0.5)
        records[1] = replace(taker, span=LayerSpan(0, 30), incarnation=1)

    async with asyncio.timeout(10), asyncio.TaskGroup() as group:
        group.create_task(announce_later())
        await pipeline.recover(session, None)
    assert [hop.node_id for hop in pipeline.traces[session].route.hops] == ["n2"]
    assert pipeline.bans.current({NodeId("n1"): 0, NodeId("n2"): 1}) == frozenset()
    # other sessions still route through it while this entry's view holds it serving
    assert [hop.node_id for hop in pipeline._choose_now(1, frozenset()).hops] == ["n1"]
    await asyncio.gather(*pipeline._background, return_exceptions=True)  # the close it sent n1
    await pipeline._links.close()


async def test_a_failure_that_leaves_layers_unserved_names_them() -> None:
    from swarm.errors import HopFailedError

    first, second = member("n1", (0, 15), ms=MS), member("n2", (15, 30), ms=MS)
    spare = member("n3", (0, 15), ms=MS)
    pipeline = _pipeline([first, second, spare])
    route = remote.PlannedRoute((), 1.0, 1.0)
    trace = remote.Trace(route, failed={NodeId("n3")})  # failed this session before
    failed = HopFailedError("cannot reach 127.0.0.1:9", first.node_id)
    named = pipeline._naming_missing(failed, trace)
    assert "cannot reach" in str(named) and "0:15" in str(named)
    assert named.node_id == first.node_id
    still_served = pipeline._naming_missing(HopFailedError("x", first.node_id), remote.Trace(route))
    assert str(still_served) == "x"


async def test_sessions_that_start_together_spread_over_replicas_by_their_speed() -> None:
    """Eight sessions choose routes before any gossip says how busy the nodes are: the ones
    this entry already placed count as load, so two replicas of 15:30, one three times as
    fast, share them about 3:1 instead of all taking the same route."""
    first = member("n1", (0, 15), ms=MS)
    fast = member("n2", (15, 30), ms=MS)
    slow_capacity = replace(
        fast.capacity, ms_per_layer_decode=3 * fast.capacity.ms_per_layer_decode
    )
    slow = member("n3", (15, 30), ms=MS, capacity=slow_capacity)
    pipeline = _pipeline([first, fast, slow])
    chosen = []
    for i in range(8):
        route = await pipeline._choose(1)
        pipeline.traces[SessionId(f"s{i}")] = remote.Trace(route)
        chosen.append(route.hops[-1].node_id)
    assert chosen.count(fast.node_id) == 6
    assert chosen.count(slow.node_id) == 2
    assert all(route.route.hops[0].node_id == first.node_id for route in pipeline.traces.values())

    # a session that ends frees its place: the next one takes the route it left
    ended = next(s for s, t in pipeline.traces.items() if t.route.hops[-1].node_id == slow.node_id)
    del pipeline.traces[ended]
    assert (await pipeline._choose(1)).hops[-1].node_id == slow.node_id


@pytest.mark.parametrize(("head_ms", "through_entry"), [(0.0, 4), (3.75, 2)])
async def test_an_entry_that_serves_a_replica_counts_its_heads_as_work_there(
    head_ms: float, through_entry: int
) -> None:
    """The entry runs the head of every session it is the entry of on its own compute thread,
    whatever their routes: with the head at half a hop's step (15 layers x 0.5 ms), its own
    replica of 15:30 takes 2 of 8 sessions that start together and the other replica 6; with
    no head cost they share them 4 and 4."""
    first = member("n1", (0, 15), ms=MS)
    own = member("entry", (15, 30), ms=MS)  # the pipeline's own node
    other = member("n3", (15, 30), ms=MS)
    pipeline = _pipeline([first, own, other], head_ms=head_ms)
    chosen = []
    for i in range(8):
        route = await pipeline._choose(1)
        pipeline.traces[SessionId(f"s{i}")] = remote.Trace(route)
        chosen.append(route.hops[-1].node_id)
    assert chosen.count(own.node_id) == through_entry
    assert chosen.count(other.node_id) == 8 - through_entry


@pytest.mark.parametrize(("slower", "kept"), [(1.2, True), (3.0, False)])
async def test_a_prompt_goes_where_its_blocks_are_kept_unless_that_route_is_much_slower(
    slower: float, kept: bool
) -> None:
    """Two replicas of 15:30; the entry sent a conversation's blocks through the slower one
    (the faster was busy then). The next turn goes there while its route is at most 1.5x
    slower (1.2x slower a replica: 1.1x the route; 3x: 2x the route)."""
    from swarm.inference.prompt_keys import HopKey
    from swarm.types import LayerSpan

    first = member("n1", (0, 15), ms=MS)
    fast = member("n2", (15, 30), ms=MS)
    slow_capacity = replace(
        fast.capacity, ms_per_layer_decode=slower * fast.capacity.ms_per_layer_decode
    )
    slow = member("n3", (15, 30), ms=MS, capacity=slow_capacity)
    pipeline = _pipeline([first, fast, slow])
    digests = ["a" * 32, "b" * 32]
    pipeline.kept.sent(
        [HopKey(first.node_id, LayerSpan(0, 15)), HopKey(slow.node_id, LayerSpan(15, 30))],
        digests,
    )
    best = await pipeline._choose(300)
    assert best.hops[-1].node_id == fast.node_id
    chosen = pipeline._keeping(best, digests, 300)
    assert chosen.hops[-1].node_id == (slow.node_id if kept else fast.node_id)
    assert chosen.hops[0].node_id == first.node_id
    await pipeline._links.close()
