"""The SWIM protocol of one node as a pure state machine (sans-I/O).

The driver (the async gossiper, or the simulator in bench/) owns the clock, the randomness and
the transport. It calls:

* `start(...)` once, then `join(...)` with bootstrap addresses;
* `receive(node, message, now, rng)` for every message that arrives;
* `poll(node, now, rng)` whenever `now >= next_wakeup(node)`;
* `announce(node, record, now)` when the local record changes, `leave(...)` to stop cleanly.

Each returns a `Step`: the new node state, the messages to send (best effort: losing any is
fine) and the updates that changed this node's view (for whoever watches membership).

Per probe interval a node pings the next member of a shuffled round-robin order; without an
ack within `probe_timeout_s` it asks `indirect_probes` others to ping it (ping-req); without
any ack by the end of the interval it suspects it. Suspicions become deaths in
`MembershipView.tick`. Updates ride on every message and are also gossiped to `gossip_fanout`
peers per gossip interval; a full push-pull with one peer keeps views converged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from random import Random
from typing import Any

from swarm.config import MembershipConfig
from swarm.membership.messages import Ack, Gossip, Message, Ping, PingReq, PushPull, Send
from swarm.membership.rejoin import Remembered, knock, missing, remember
from swarm.membership.state import (
    NODE_FIELDS,
    NodeState,
    Probe,
    ProtocolLimits,
    Relay,
    Step,
    push_pull_interval,
)
from swarm.membership.updates import Alive, Left, Suspect, Update
from swarm.membership.view import MembershipView, refute, soften_dead
from swarm.types import MemberRecord, MemberState, NodeId

__all__ = [
    "NodeState",
    "ProtocolLimits",
    "Step",
    "announce",
    "join",
    "leave",
    "next_wakeup",
    "poll",
    "push_pull_interval",
    "receive",
    "start",
]


def start(
    config: MembershipConfig,
    local: MemberRecord,
    now: float,
    rng: Random,
    limits: ProtocolLimits | None = None,
) -> NodeState:
    """A node that knows only itself; its timers start at random phases."""
    return NodeState(
        config=config,
        limits=limits or ProtocolLimits(),
        local=local,
        view=MembershipView.of([local], now),
        next_probe_at=now + rng.uniform(0, config.probe_interval_s),
        next_gossip_at=now + rng.uniform(0, config.gossip_interval_s),
        next_push_pull_at=now + rng.uniform(0, config.push_pull_interval_s),
    )


def join(
    node: NodeState, addresses: Iterable[str], remembered: Iterable[tuple[str, float]] = ()
) -> Step:
    """Exchange full state with each bootstrap address. The addresses are kept: while the node
    knows no other live member, every probe interval asks them again (a lost join, or a swarm
    that restarted around this node). `remembered`: addresses seen alive before, with when on
    this clock (a restart's memory), knocked on as healing does (`swarm.membership.rejoin`)."""
    me = node.local.address
    seen = tuple(sorted((a, t) for a, t in dict(remembered).items() if a != me))
    seeds = tuple(dict.fromkeys((*node.seeds, *addresses)))  # any found on the LAN already
    node = replace(node, seeds=seeds, remembered=Remembered(seen))
    return Step(node, _join_sends(node, node.seeds))


def discovered(node: NodeState, address: str) -> Step:
    """A member of this swarm found at `address` (on the LAN): joined as a bootstrap address
    is, and kept with them, so it is asked again while this node knows no one."""
    if address == node.local.address or address in node.seeds:
        return Step(node)
    node = replace(node, seeds=(*node.seeds, address))
    return Step(node, _join_sends(node, (address,)))


def _join_sends(node: NodeState, addresses: Iterable[str]) -> tuple[Send, ...]:
    state = node.view.full_state(node.node_id)
    return tuple(
        Send(a, PushPull(node.node_id, node.local.address, state, join=True))
        for a in addresses
        if a != node.local.address
    )


def _heal(turn: _Turn, now: float, seeds: Sequence[str]) -> None:
    """At the probe cadence: remember who is alive, and knock on the remembered addresses
    and `seeds` that no live member has."""
    node = turn.node
    me = node.local.address
    remembered = remember(node.remembered, node.view, me, now, node.config)
    absent = missing(remembered, node.view, seeds, me)
    remembered, targets = knock(remembered, absent, now, node.config)
    turn.set(remembered=remembered)
    turn.sends.extend(_join_sends(node, targets))


def announce(node: NodeState, record: MemberRecord, now: float) -> Step:
    """Publish a changed local record (load, span, ...) under a higher incarnation."""
    turn = _Turn(node)
    turn.become(replace(record, incarnation=node.local.incarnation + 1), now)
    return turn.step()


def leave(node: NodeState, now: float, rng: Random) -> Step:
    """Announce a graceful leave and gossip it at once; keep polling a little to repeat it."""
    turn = _Turn(replace(node, leaving=True, probe=None))
    left = Left(node.node_id, node.local.incarnation)
    view, _ = node.view.apply(left, now)
    turn.set(view=view, queue=turn.node.queue.push(left))
    turn.changes.append(left)
    _gossip(turn, now, rng)
    return turn.step()


def suspect(node: NodeState, node_id: NodeId, now: float, rng: Random) -> Step:
    """Suspect a member on outside evidence (a step through it failed on the data path), as if
    a probe had missed: it dies after the suspicion timeout unless it refutes."""
    entry = node.view.get(node_id)
    if node_id == node.node_id or entry is None or entry.state is not MemberState.ALIVE:
        return Step(node, (), ())
    turn = _Turn(node)
    turn.learn(Suspect(node_id, entry.incarnation, node.node_id), now, rng)
    return turn.step()


def next_wakeup(node: NodeState) -> float:
    """When `poll` next has something to do."""
    times = [node.next_gossip_at]
    if not node.leaving:
        times += [node.next_probe_at, node.next_push_pull_at]
    if node.probe is not None:
        times.append(node.probe.deadline if node.probe.indirect_sent else node.probe.indirect_at)
    times += [r.expires for r in node.relays]
    view_deadline = node.view.next_deadline(node.config)
    if view_deadline is not None:
        times.append(view_deadline)
    return min(times)


def poll(node: NodeState, now: float, rng: Random) -> Step:
    """Run whatever is due at `now`: probe stages, suspicion expiry, gossip, push-pull."""
    turn = _Turn(node)
    cfg = node.config
    turn.set(relays=tuple(r for r in node.relays if r.expires > now))
    if not node.leaving:
        _advance_probe(turn, now, rng)
        if now >= node.next_probe_at:
            alone = len(node.view.live_ids) <= 1  # only itself
            if alone:  # the bootstrap addresses, every probe interval
                turn.sends.extend(_join_sends(node, node.seeds))
            else:
                _start_probe(turn, now, rng)
            _heal(turn, now, seeds=() if alone else node.seeds)
            turn.set(next_probe_at=_after(node.next_probe_at, cfg.probe_interval_s, now))
    view, declared = turn.node.view.tick(now, cfg, node.node_id)
    turn.set(view=view)
    for dead in declared:
        turn.set(queue=turn.node.queue.push(dead))
        turn.changes.append(dead)
    if now >= node.next_gossip_at:
        _gossip(turn, now, rng)
        turn.set(next_gossip_at=_after(node.next_gossip_at, cfg.gossip_interval_s, now))
    if not node.leaving and now >= node.next_push_pull_at:
        _push_pull(turn, now, rng)
        interval = push_pull_interval(cfg, len(turn.node.view.live_ids))
        turn.set(next_push_pull_at=_after(node.next_push_pull_at, interval, now))
    return turn.step()


def receive(node: NodeState, message: Message, now: float, rng: Random) -> Step:
    """Merge what a message carries and answer it. A sender that gossips an accusation older
    than a refutation we hold missed that refutation: it gets it back at once (see `_Turn`)."""
    turn = _Turn(node)
    if isinstance(message, PushPull):
        for update in message.state:
            turn.learn(soften_dead(update), now, rng)
        if not message.reply:
            state = turn.node.view.full_state(node.node_id)
            turn.send(message.reply_to, PushPull(node.node_id, node.local.address, state, True))
            return turn.step()
    else:
        for update in message.updates:
            turn.learn(update, now, rng)
    corrections = tuple(turn.corrections[: node.limits.max_piggyback])
    if isinstance(message, Ping) and message.target == node.node_id:
        ack = Ack(*turn.header(), message.seq, corrections + turn.piggyback())
        turn.send(message.reply_to, ack)
        return turn.step()
    if corrections:
        turn.send(message.reply_to, Gossip(*turn.header(), corrections))
    if isinstance(message, PingReq):
        seq = turn.next_seq()
        relay = Relay(seq, message.reply_to, message.seq, now + node.config.probe_timeout_s)
        turn.set(relays=(*turn.node.relays, relay))
        ping = Ping(*turn.header(), seq, message.target, turn.piggyback())
        turn.send(message.target_address, ping)
    elif isinstance(message, Ack):
        _on_ack(turn, message)
    return turn.step()


# ---- internals ---------------------------------------------------------------------------


class _Turn:
    """Accumulates one call's state changes and outgoing messages; never outlives the call."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.sends: list[Send] = []
        self.changes: list[Update] = []
        self.corrections: list[Update] = []  # newer news for the sender of stale news

    def step(self) -> Step:
        return Step(self.node, tuple(self.sends), tuple(self.changes))

    def set(self, **changes: Any) -> None:
        # dataclasses.replace re-runs field introspection on every call and dominated the
        # 500-member simulation; a shallow copy of a frozen instance's dict is equivalent
        # here (NodeState has no __post_init__ and every field name is checked below).
        node = object.__new__(NodeState)
        node.__dict__.update(self.node.__dict__)
        for name in changes:
            if name not in NODE_FIELDS:
                raise TypeError(f"NodeState has no field {name!r}")
        node.__dict__.update(changes)
        self.node = node

    def header(self) -> tuple[NodeId, str]:
        return self.node.node_id, self.node.local.address

    def next_seq(self) -> int:
        self.set(seq=self.node.seq + 1)
        return self.node.seq

    def send(self, address: str, message: Message) -> None:
        self.sends.append(Send(address, message))

    def piggyback(self) -> tuple[Update, ...]:
        lim = self.node.limits
        queue, updates = self.node.queue.take(
            len(self.node.view.live_ids),
            lim.retransmit_mult,
            lim.max_piggyback,
            lim.max_piggyback_bytes,
            lim.size_of,
        )
        self.set(queue=queue)
        return updates

    def become(self, record: MemberRecord, now: float) -> None:
        """Make `record` the local record and gossip it."""
        alive = Alive(record)
        view, _ = self.node.view.apply(alive, now)
        self.set(local=record, view=view, queue=self.node.queue.push(alive))
        self.changes.append(alive)

    def learn(self, update: Update, now: float, rng: Random) -> None:
        """Merge one update; refute it if it is about us, re-gossip it if it was news."""
        node = self.node
        if update.node_id == node.node_id:
            refuted = refute(node.local, update, node.leaving)
            if refuted is not None:
                self.become(refuted, now)
            else:
                self.check_stale(update)
            return
        before = node.view.get(update.node_id)
        view, changed = node.view.apply(update, now)
        if not changed:
            self.check_stale(update)
            return
        self.set(view=view, queue=node.queue.push(update))
        self.changes.append(update)
        after = view.get(update.node_id)
        if after is not None and after.is_live and (before is None or not before.is_live):
            # A newcomer joins this round at a random place, so it is probed soon.
            at = rng.randint(0, len(node.order))
            self.set(order=(*node.order[:at], update.node_id, *node.order[at:]))

    def check_stale(self, update: Update) -> None:
        """An accusation below the incarnation of an alive member we know means the sender
        missed that member's refutation, and once the refutation's retransmits are spent no
        gossip would ever repair it: the sender would declare a live member dead."""
        if isinstance(update, Alive):
            return
        entry = self.node.view.get(update.node_id)
        if (
            entry is not None
            and entry.record is not None
            and entry.state is MemberState.ALIVE
            and entry.incarnation > update.incarnation
        ):
            correction = Alive(entry.record)
            if correction not in self.corrections:
                self.corrections.append(correction)


def _after(previous: float, interval: float, now: float) -> float:
    """The next tick of a fixed-rate timer, skipping ticks missed while the node was busy."""
    nxt = previous + interval
    return nxt if nxt > now else now + interval


def _random_peers(
    ids: tuple[NodeId, ...], k: int, exclude: set[NodeId], rng: Random
) -> list[NodeId]:
    if k <= 0:
        return []
    if len(ids) <= 4 * (k + len(exclude)):
        pool = [i for i in ids if i not in exclude]
        return rng.sample(pool, min(k, len(pool)))
    picked: list[NodeId] = []
    while len(picked) < k:
        candidate = ids[rng.randrange(len(ids))]
        if candidate not in exclude and candidate not in picked:
            picked.append(candidate)
    return picked


def _address(view: MembershipView, node_id: NodeId) -> str:
    entry = view.get(node_id)
    return entry.record.address if entry is not None and entry.record is not None else ""


def _next_target(turn: _Turn, rng: Random) -> NodeId | None:
    node = turn.node
    order = node.order
    if not order:
        order = tuple(i for i in node.view.live_ids if i != node.node_id)
        order = tuple(rng.sample(order, len(order)))
    for at, candidate in enumerate(order):
        entry = node.view.get(candidate)
        if entry is not None and entry.is_live and candidate != node.node_id:
            turn.set(order=order[at + 1 :])
            return candidate
    turn.set(order=())
    return None


def _start_probe(turn: _Turn, now: float, rng: Random) -> None:
    target = _next_target(turn, rng)
    if target is None:
        return
    entry = turn.node.view.get(target)
    if entry is None or entry.record is None:
        return
    seq = turn.next_seq()
    updates = turn.piggyback()
    if entry.state is MemberState.SUSPECT:
        # Lifeguard's buddy system: tell a suspect first, so it can refute in time.
        updates = (Suspect(target, entry.incarnation, turn.node.node_id), *updates)
    turn.send(entry.record.address, Ping(*turn.header(), seq, target, updates))
    cfg = turn.node.config
    probe = Probe(
        target, entry.record.address, seq, now + cfg.probe_timeout_s, now + cfg.probe_interval_s
    )
    turn.set(probe=probe)


def _advance_probe(turn: _Turn, now: float, rng: Random) -> None:
    probe = turn.node.probe
    if probe is None:
        return
    if now >= probe.deadline:
        turn.set(probe=None)
        entry = turn.node.view.get(probe.target)
        if entry is not None and entry.is_live:
            turn.learn(Suspect(probe.target, entry.incarnation, turn.node.node_id), now, rng)
    elif not probe.indirect_sent and now >= probe.indirect_at:
        turn.set(probe=replace(probe, indirect_sent=True))
        exclude = {turn.node.node_id, probe.target}
        peers = _random_peers(
            turn.node.view.live_ids, turn.node.config.indirect_probes, exclude, rng
        )
        for peer in peers:
            req = PingReq(*turn.header(), probe.seq, probe.target, probe.address, turn.piggyback())
            turn.send(_address(turn.node.view, peer), req)


def _on_ack(turn: _Turn, ack: Ack) -> None:
    probe = turn.node.probe
    if probe is not None and probe.seq == ack.seq:
        turn.set(probe=None)
        return
    for relay in turn.node.relays:
        if relay.seq == ack.seq:
            turn.set(relays=tuple(r for r in turn.node.relays if r is not relay))
            forwarded = Ack(*turn.header(), relay.requester_seq, turn.piggyback())
            turn.send(relay.requester, forwarded)
            return


def _gossip_targets(node: NodeState, now: float) -> tuple[NodeId, ...]:
    """Live members, and the recently dead: a member wrongly declared dead hears it and refutes."""
    recent = node.view.recently_gone(now, node.limits.gossip_to_dead_s, MemberState.DEAD)
    return node.view.live_ids + recent


def _gossip(turn: _Turn, now: float, rng: Random) -> None:
    if not turn.node.queue:
        return
    targets = _gossip_targets(turn.node, now)
    for peer in _random_peers(targets, turn.node.config.gossip_fanout, {turn.node.node_id}, rng):
        updates = turn.piggyback()
        if not updates:
            return
        turn.send(_address(turn.node.view, peer), Gossip(*turn.header(), updates))


def _push_pull(turn: _Turn, now: float, rng: Random) -> None:
    """A full sync with one live member, and with one member declared dead that is still
    listed (serf's reconnect): after a partition heals, each side has declared the other dead
    and no probe or gossip would cross again; this exchange makes the dead side refute."""
    node = turn.node
    peers = _random_peers(node.view.live_ids, 1, {node.node_id}, rng)
    dead = node.view.recently_gone(now, node.config.dead_reclaim_s, MemberState.DEAD)
    if dead:
        peers.append(dead[rng.randrange(len(dead))])
    for peer in peers:
        state = node.view.full_state(node.node_id)
        turn.send(_address(node.view, peer), PushPull(*turn.header(), state))
