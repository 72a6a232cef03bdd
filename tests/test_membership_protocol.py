"""One node's SWIM state machine, driven by hand, and a small cluster on a simulated clock."""

from __future__ import annotations

from dataclasses import replace
from random import Random

from harness.factories import member
from harness.membership_sim import LOCAL, Cluster, addr
from swarm.membership import protocol
from swarm.membership.messages import Ack, Gossip, Message, Ping, PingReq, PushPull
from swarm.membership.protocol import NodeState, Step
from swarm.membership.updates import Alive, Dead, Left, Suspect
from swarm.membership.view import MembershipView
from swarm.types import MemberState, NodeId

NAMES = ["a", "b", "c", "d", "e"]


def node(name: str = "a", peers: list[str] = NAMES, now: float = 0.0) -> NodeState:
    """A node that already knows `peers` (itself included) as alive."""
    state = protocol.start(LOCAL, member(name), now, Random(1))
    view = MembershipView.of([member(p) for p in {name, *peers}], now)
    return replace(state, view=view)


def only(step: Step, kind: type) -> list[tuple[str, Message]]:
    return [(s.address, s.message) for s in step.sends if isinstance(s.message, kind)]


def test_ping_is_acked_with_the_same_seq() -> None:
    b = node("b")
    step = protocol.receive(b, Ping(NodeId("a"), addr("a"), 7, NodeId("b")), 1.0, Random(0))
    [(to, ack)] = only(step, Ack)
    assert to == addr("a") and isinstance(ack, Ack) and ack.seq == 7


def test_ping_meant_for_another_node_is_not_acked() -> None:
    b = node("b")
    step = protocol.receive(b, Ping(NodeId("a"), addr("a"), 7, NodeId("z")), 1.0, Random(0))
    assert step.sends == ()


def start_probe(a: NodeState) -> tuple[Step, str]:
    step = protocol.poll(a, a.next_probe_at, Random(0))
    [(_, ping)] = only(step, Ping)
    assert isinstance(ping, Ping)
    return step, ping.target


def test_missed_probe_goes_indirect_then_suspects() -> None:
    a = node("a")
    step, target = start_probe(a)
    probe = step.node.probe
    assert probe is not None and protocol.next_wakeup(step.node) <= probe.indirect_at
    step = protocol.poll(step.node, probe.indirect_at, Random(0))
    asked = only(step, PingReq)
    assert len(asked) == LOCAL.indirect_probes
    assert {to for to, _ in asked}.isdisjoint({addr("a"), addr(target)})
    assert all(isinstance(m, PingReq) and m.target == target for _, m in asked)
    step = protocol.poll(step.node, probe.deadline, Random(0))
    assert Suspect(NodeId(target), 0, NodeId("a")) in step.changes
    assert step.node.view.state_of(NodeId(target)) is MemberState.SUSPECT
    carried = [s.message for s in step.sends if not isinstance(s.message, PushPull)]
    assert any(Suspect(NodeId(target), 0, NodeId("a")) in m.updates for m in carried)


def test_ack_ends_the_probe() -> None:
    step, target = start_probe(node("a"))
    probe = step.node.probe
    assert probe is not None
    ack = Ack(NodeId(target), addr(target), probe.seq)
    step = protocol.receive(step.node, ack, probe.indirect_at - 0.01, Random(0))
    assert step.node.probe is None
    step = protocol.poll(step.node, probe.deadline, Random(0))
    assert step.node.view.state_of(NodeId(target)) is MemberState.ALIVE


def test_indirect_probe_forwards_the_ack_under_the_askers_seq() -> None:
    c = node("c")
    req = PingReq(NodeId("a"), addr("a"), 41, NodeId("b"), addr("b"))
    step = protocol.receive(c, req, 1.0, Random(0))
    [(to, ping)] = only(step, Ping)
    assert to == addr("b") and isinstance(ping, Ping) and ping.target == "b"
    step = protocol.receive(step.node, Ack(NodeId("b"), addr("b"), ping.seq), 1.05, Random(0))
    [(to, ack)] = only(step, Ack)
    assert to == addr("a") and isinstance(ack, Ack) and ack.seq == 41
    assert step.node.relays == ()


def test_relay_expires_after_the_probe_timeout() -> None:
    c = node("c")
    req = PingReq(NodeId("a"), addr("a"), 41, NodeId("b"), addr("b"))
    step = protocol.receive(c, req, 1.0, Random(0))
    step = protocol.poll(step.node, 1.0 + LOCAL.probe_timeout_s, Random(0))
    assert step.node.relays == ()


def test_node_refutes_a_suspicion_about_itself() -> None:
    b = node("b")
    gossip = Gossip(NodeId("a"), addr("a"), (Suspect(NodeId("b"), 0, NodeId("a")),))
    step = protocol.receive(b, gossip, 1.0, Random(0))
    assert step.node.local.incarnation == 1
    assert step.changes == (Alive(step.node.local),)
    assert step.node.queue.about(NodeId("b")) == Alive(step.node.local)
    assert step.node.view.state_of(NodeId("b")) is MemberState.ALIVE


def test_a_failure_seen_on_the_data_path_makes_a_suspect() -> None:
    a = node("a")
    step = protocol.suspect(a, NodeId("b"), 1.0, Random(0))
    entry = step.node.view.get(NodeId("b"))
    assert entry is not None and entry.state is MemberState.SUSPECT
    assert any(isinstance(u, Suspect) and u.node_id == "b" for u in step.changes)
    for nobody in ("a", "zz"):  # itself, and a member it does not know
        assert protocol.suspect(a, NodeId(nobody), 1.0, Random(0)).changes == ()


def test_probing_a_suspect_tells_it_first() -> None:
    a = node("a", ["a", "b"])
    a = replace(a, view=a.view.apply(Suspect(NodeId("b"), 0, NodeId("c")), 0.0)[0])
    step, _ = start_probe(a)
    [(_, ping)] = only(step, Ping)
    assert isinstance(ping, Ping) and ping.updates[0] == Suspect(NodeId("b"), 0, NodeId("a"))


def test_join_exchanges_full_state() -> None:
    seed = node("a")
    joiner = protocol.start(LOCAL, member("z"), 0.0, Random(0))
    step = protocol.join(joiner, [addr("a")])
    [(to, hello)] = only(step, PushPull)
    assert to == addr("a") and isinstance(hello, PushPull) and hello.join
    seen = protocol.receive(seed, hello, 0.1, Random(0))
    assert Alive(member("z")) in seen.changes
    [(back, reply)] = only(seen, PushPull)
    assert back == addr("z") and isinstance(reply, PushPull) and reply.reply
    learned = protocol.receive(step.node, reply, 0.2, Random(0))
    assert learned.sends == ()
    assert [r.node_id for r in learned.node.view.alive_members()] == [*NAMES, "z"]


def test_join_is_retried_while_alone() -> None:
    joiner = protocol.start(LOCAL, member("z"), 0.0, Random(0))
    step = protocol.join(joiner, [addr("a")])
    step = protocol.poll(step.node, step.node.next_probe_at, Random(0))
    assert [to for to, _ in only(step, PushPull)] == [addr("a")]


def test_leave_is_gossiped_and_not_refuted() -> None:
    a = node("a")
    step = protocol.leave(a, 1.0, Random(0))
    gossips = only(step, Gossip)
    assert len(gossips) == LOCAL.gossip_fanout
    assert all(isinstance(m, Gossip) and Left(NodeId("a"), 0) in m.updates for _, m in gossips)
    late = Gossip(NodeId("b"), addr("b"), (Dead(NodeId("a"), 0, NodeId("b")),))
    after = protocol.receive(step.node, late, 1.1, Random(0))
    assert after.node.local.incarnation == 0 and after.changes == ()


def test_announce_publishes_a_new_record_at_a_higher_incarnation() -> None:
    a = node("a")
    step = protocol.announce(a, replace(member("a"), num_layers=31), 1.0)
    assert step.node.local.incarnation == 1 and step.node.local.num_layers == 31
    assert step.changes == (Alive(step.node.local),)


def test_poll_always_moves_the_wakeup_forward() -> None:
    state, rng, now = node("a"), Random(3), 0.0
    for _ in range(200):
        now = protocol.next_wakeup(state)
        state = protocol.poll(state, now, rng).node
        assert protocol.next_wakeup(state) > now


# ---- a small cluster ---------------------------------------------------------------------


def test_cluster_learns_a_join_and_a_crash() -> None:
    names = [f"m{i}" for i in range(8)]
    cluster = Cluster([member(n) for n in names])
    cluster.run_until(1.0)
    joiner = protocol.start(LOCAL, member("new"), cluster.now, cluster.rng)
    cluster.commit(addr("new"), protocol.join(joiner, [addr("m0")]))
    cluster.run_until(2.0)
    assert cluster.states_of("new") == {MemberState.ALIVE}
    cluster.down.add(addr("m3"))
    timeout = LOCAL.suspicion_timeout_s(9)
    cluster.run_until(2.0 + 4 * LOCAL.probe_interval_s + timeout)
    assert cluster.states_of("m3") == {MemberState.DEAD}
    assert cluster.states_of("m5") == {MemberState.ALIVE}


def test_stale_accusation_is_answered_with_the_refutation() -> None:
    """A sender that missed a refutation would otherwise declare a live member dead."""
    c = node("c")
    c = replace(c, view=c.view.apply(Alive(member("b", incarnation=1)), 0.0)[0])
    stale = Gossip(NodeId("a"), addr("a"), (Dead(NodeId("b"), 0, NodeId("a")),))
    step = protocol.receive(c, stale, 1.0, Random(0))
    assert step.changes == ()
    [(to, back)] = only(step, Gossip)
    assert to == addr("a") and isinstance(back, Gossip)
    assert back.updates == (Alive(member("b", incarnation=1)),)


def test_stale_accusation_about_itself_rides_on_the_ack() -> None:
    b = replace(node("b"), local=member("b", incarnation=2))
    b = replace(b, view=b.view.apply(Alive(b.local), 0.0)[0])
    ping = Ping(NodeId("a"), addr("a"), 9, NodeId("b"), (Suspect(NodeId("b"), 1, NodeId("a")),))
    step = protocol.receive(b, ping, 1.0, Random(0))
    assert step.node.local.incarnation == 2
    [(_, ack)] = only(step, Ack)
    assert isinstance(ack, Ack) and ack.updates[0] == Alive(member("b", incarnation=2))


def test_a_healed_partition_converges_within_a_full_sync() -> None:
    """Each side declares the other dead; after healing, the full sync with a dead member
    makes both sides refute, so every view is all-alive again within one push-pull interval
    (plus a little gossip)."""
    names = [f"m{i}" for i in range(5)]
    cluster = Cluster([member(n) for n in names])
    cluster.run_until(1.0)
    cluster.sides = [{addr(n) for n in names[:3]}]
    cluster.run_until(6.0)
    assert all(cluster.states_of(n) == {MemberState.ALIVE, MemberState.DEAD} for n in names)
    cluster.sides = []
    cluster.run_until(6.0 + LOCAL.push_pull_interval_s + 2.0)
    assert all(cluster.states_of(n) == {MemberState.ALIVE} for n in names)
