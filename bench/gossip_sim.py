"""Discrete-event simulation of SWIM membership with swarm's real pure core.

Every node runs `swarm.membership.protocol` unchanged; this file only schedules events on a
simulated clock and delivers messages over an in-memory network that loses each message with
probability `--loss` and delays it uniformly within `--delay-ms`. All randomness comes from
seeded `random.Random` instances, so a run is reproducible.

Scenario: `--members` nodes start knowing each other (a converged swarm). At `--join-at` a new
node joins through one bootstrap node; at `--crash-at` a random original node stops answering.
Measured over `--window` simulated seconds:

* join: seconds until every running node lists the newcomer as a member;
* crash: seconds until every running node marks the crashed node dead;
* false suspicions / false deaths: distinct (member, incarnation) of running members that
  some node suspected / declared dead (every false death is later refuted).

    python -m bench.gossip_sim --members 100 500 --loss 0.01 0.10 [--seed 1] [--window 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from swarm.config import Config, MembershipConfig
from swarm.membership import protocol
from swarm.membership.messages import Message, Send
from swarm.membership.protocol import NodeState, ProtocolLimits, Step
from swarm.membership.updates import Alive, Dead, Suspect, Update
from swarm.membership.view import MembershipView
from swarm.types import Capacity, LayerSpan, MemberRecord, ModelId, NodeId

MODEL = ModelId("0" * 64)
_WAKE = 0
_DELIVER = 1


def member(i: int) -> MemberRecord:
    return MemberRecord(
        node_id=NodeId(f"n{i:04d}"),
        address=f"10.0.{i // 250}.{i % 250}:7070",
        incarnation=0,
        model_id=MODEL,
        num_layers=30,
        capacity=Capacity("cpu", "float32", 8 << 30, 20 << 20, 1.0, 0.5),
        span=LayerSpan(0, 30),
    )


@dataclass
class Scenario:
    members: int
    loss: float
    seed: int = 1
    window_s: float = 60.0
    join_at: float = 5.0
    crash_at: float = 15.0
    delay_ms: tuple[float, float] = (0.5, 5.0)
    config: MembershipConfig = field(default_factory=lambda: Config.lan().membership)
    limits: ProtocolLimits = field(default_factory=ProtocolLimits)


@dataclass
class Result:
    scenario: Scenario
    join_s: float  # inf when some node never learned of the join
    crash_s: float
    false_suspicions: int
    false_deaths: int
    messages: int
    cpu_s: float


@dataclass
class Metrics:
    joiner: NodeId
    crashed: NodeId | None = None
    learned_join: dict[NodeId, float] = field(default_factory=dict)
    learned_crash: dict[NodeId, float] = field(default_factory=dict)
    suspicions: set[tuple[NodeId, int]] = field(default_factory=set)
    deaths: set[tuple[NodeId, int]] = field(default_factory=set)

    def observe(self, observer: NodeId, changes: tuple[Update, ...], now: float) -> None:
        for u in changes:
            if isinstance(u, Alive) and u.node_id == self.joiner:
                self.learned_join.setdefault(observer, now)
            elif u.node_id == self.crashed and isinstance(u, Dead):
                self.learned_crash.setdefault(observer, now)
            elif isinstance(u, Suspect) and u.node_id != self.crashed:
                self.suspicions.add((u.node_id, u.incarnation))
            elif isinstance(u, Dead):
                self.deaths.add((u.node_id, u.incarnation))


class Simulation:
    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.net_rng = random.Random(scenario.seed * 7919 + 1)
        self.rng = random.Random(scenario.seed)
        self.events: list[tuple[float, int, int, str, Message | None]] = []
        self.counter = 0
        self.scheduled: dict[str, float] = {}
        self.nodes: dict[str, NodeState] = {}
        self.crashed: set[str] = set()
        self.messages = 0
        self.actions: dict[int, Callable[[float], None]] = {}  # scenario steps by event counter
        joiner = member(scenario.members)
        self.joiner = joiner
        self.metrics = Metrics(joiner.node_id)

    def run(self) -> Result:
        started = time.process_time()
        self._boot()
        self._at(self.s.join_at, self._join)
        self._at(self.s.crash_at, self._crash)
        for t, kind, address, message in self._pop_until(self.s.window_s):
            self._handle(t, kind, address, message)
        return self._result(time.process_time() - started)

    def _boot(self) -> None:
        records = [member(i) for i in range(self.s.members)]
        shared = MembershipView.of(records, 0.0)  # immutable, so every node can hold it
        for record in records:
            node = protocol.start(self.s.config, record, 0.0, self.rng, self.s.limits)
            self._commit(record.address, Step(dataclasses.replace(node, view=shared)), 0.0)

    def _join(self, now: float) -> None:
        node = protocol.start(self.s.config, self.joiner, now, self.rng, self.s.limits)
        bootstrap = member(self.rng.randrange(self.s.members)).address
        self.metrics.learned_join[self.joiner.node_id] = now
        self._commit(self.joiner.address, protocol.join(node, [bootstrap]), now)

    def _crash(self, now: float) -> None:
        victim = member(self.rng.randrange(self.s.members))
        self.metrics.crashed = victim.node_id
        self.crashed.add(victim.address)

    def _handle(self, t: float, kind: int, address: str, message: Message | None) -> None:
        if address in self.crashed or address not in self.nodes:
            return
        node = self.nodes[address]
        if kind == _WAKE:
            if self.scheduled.get(address) != t:
                return  # superseded by an earlier wake-up
            self._commit(address, protocol.poll(node, t, self.rng), t)
        elif message is not None:
            self._commit(address, protocol.receive(node, message, t, self.rng), t)

    def _commit(self, address: str, step: Step, now: float) -> None:
        self.nodes[address] = step.node
        if step.changes:
            self.metrics.observe(step.node.node_id, step.changes, now)
        for send in step.sends:
            self._transmit(send, now)
        wake = max(protocol.next_wakeup(step.node), now + 1e-6)
        if self.scheduled.get(address) != wake:
            self.scheduled[address] = wake
            self._push(wake, _WAKE, address, None)

    def _transmit(self, send: Send, now: float) -> None:
        self.messages += 1
        if self.net_rng.random() < self.s.loss:
            return
        low, high = self.s.delay_ms
        self._push(
            now + self.net_rng.uniform(low, high) / 1000, _DELIVER, send.address, send.message
        )

    def _push(self, t: float, kind: int, address: str, message: Message | None) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, self.counter, kind, address, message))

    def _at(self, t: float, action: Callable[[float], None]) -> None:
        self._push(t, -1, "", None)
        self.actions[self.counter] = action

    def _pop_until(self, end: float) -> Iterator[tuple[float, int, str, Message | None]]:
        while self.events and self.events[0][0] <= end:
            t, counter, kind, address, message = heapq.heappop(self.events)
            if kind < 0:
                self.actions.pop(counter)(t)
                continue
            yield t, kind, address, message

    def _result(self, cpu_s: float) -> Result:
        m = self.metrics
        running = [n.node_id for a, n in self.nodes.items() if a not in self.crashed]
        join_s = _all_by(m.learned_join, running) - self.s.join_at
        crash_s = _all_by(m.learned_crash, running) - self.s.crash_at
        false_deaths = {d for d in m.deaths if d[0] != m.crashed}
        return Result(
            self.s, join_s, crash_s, len(m.suspicions), len(false_deaths), self.messages, cpu_s
        )


def _all_by(first_seen: dict[NodeId, float], nodes: list[NodeId]) -> float:
    return max((first_seen.get(n, math.inf) for n in nodes), default=math.inf)


def table(groups: list[list[Result]]) -> str:
    """One row per (members, loss): medians and worst cases over the seeds."""
    head = (
        "| members | loss | seeds | join known to all, median / worst (s) "
        "| crash known to all, median / worst (s) | false suspicions per run "
        "| false deaths (all runs) | messages per node per s | CPU per run (s) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for runs in groups:
        s = runs[0].scenario
        joins = [r.join_s for r in runs]
        crashes = [r.crash_s for r in runs]
        msgs = statistics.mean(r.messages for r in runs) / (s.members * s.window_s)
        rows.append(
            f"| {s.members} | {s.loss:.0%} | {len(runs)} "
            f"| {statistics.median(joins):.2f} / {max(joins):.2f} "
            f"| {statistics.median(crashes):.2f} / {max(crashes):.2f} "
            f"| {statistics.mean(r.false_suspicions for r in runs):.1f} "
            f"| {sum(r.false_deaths for r in runs)} | {msgs:.1f} "
            f"| {statistics.mean(r.cpu_s for r in runs):.1f} |"
        )
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--loss", type=float, nargs="+", default=[0.01, 0.10])
    parser.add_argument("--seeds", type=int, default=3, help="runs per row, seeds 1..N")
    parser.add_argument("--window", type=float, default=60.0, help="simulated seconds")
    parser.add_argument(
        "--suspicion-multiplier",
        type=float,
        default=None,
        help="override Config.lan().membership.suspicion_multiplier",
    )
    parser.add_argument(
        "--retransmit-mult",
        type=int,
        default=ProtocolLimits().retransmit_mult,
        help="sends per update = this x ceil(log10(n+1))",
    )
    args = parser.parse_args()
    limits = ProtocolLimits(retransmit_mult=args.retransmit_mult)
    config = Config.lan().membership
    if args.suspicion_multiplier is not None:
        config = dataclasses.replace(config, suspicion_multiplier=args.suspicion_multiplier)
    groups = []
    for n in args.members:
        for loss in args.loss:
            runs = [
                Simulation(Scenario(n, loss, seed, args.window, config=config, limits=limits)).run()
                for seed in range(1, args.seeds + 1)
            ]
            groups.append(runs)
            print(table([runs]).splitlines()[-1], flush=True)
    print(
        f"\nsuspicion timeout: {config.suspicion_multiplier} x log10(n+1) x "
        f"{config.probe_interval_s} s; retransmits: {limits.retransmit_mult} x ceil(log10(n+1))\n"
    )
    print(table(groups))


if __name__ == "__main__":
    main()
