"""SWIM membership driven by hand, for the membership tests: a member table built from
updates, and nodes on a simulated clock with a lossless 1 ms network."""

from __future__ import annotations

import heapq
from dataclasses import replace
from random import Random

from harness.factories import member
from swarm.config import Config
from swarm.membership import protocol
from swarm.membership.messages import Message
from swarm.membership.protocol import NodeState, Step
from swarm.membership.updates import Update
from swarm.membership.view import MembershipView
from swarm.types import MemberRecord, MemberState, NodeId

LOCAL = Config.local().membership


def view_of(*updates: Update, now: float = 0.0) -> MembershipView:
    """The member table after `updates`, all applied at `now`."""
    view, _ = MembershipView.empty().apply_all(updates, now)
    return view


def addr(name: str) -> str:
    """The address of `member(name)`."""
    return member(name).address


class Cluster:
    """Nodes on a simulated clock with a lossless 1 ms network; crashed nodes go silent."""

    def __init__(self, records: list[MemberRecord]) -> None:
        self.rng = Random(7)
        self.now = 0.0
        self.events: list[tuple[float, int, str, Message | None]] = []
        self.count = 0
        self.nodes: dict[str, NodeState] = {}
        self.down: set[str] = set()
        self.sides: list[set[str]] = []  # a partition: messages between sides are lost
        shared = MembershipView.of(records, 0.0)
        for r in records:
            self.commit(
                r.address, Step(replace(protocol.start(LOCAL, r, 0.0, self.rng), view=shared))
            )

    def commit(self, address: str, step: Step) -> None:
        self.nodes[address] = step.node
        for send in step.sends:
            self.push(self.now + 0.001, send.address, send.message)
        self.push(protocol.next_wakeup(step.node), address, None)

    def push(self, t: float, address: str, message: Message | None) -> None:
        if message is not None and self.cut(message.reply_to, address):
            return
        self.count += 1
        heapq.heappush(self.events, (t, self.count, address, message))

    def run_until(self, end: float) -> None:
        while self.events and self.events[0][0] <= end:
            self.now, _, address, message = heapq.heappop(self.events)
            state = self.nodes.get(address)
            if state is None or address in self.down:
                continue
            if message is not None:
                self.commit(address, protocol.receive(state, message, self.now, self.rng))
            elif self.now >= protocol.next_wakeup(state):
                self.commit(address, protocol.poll(state, self.now, self.rng))
        self.now = end

    def cut(self, a: str, b: str) -> bool:
        return any((a in side) != (b in side) for side in self.sides)

    def states_of(self, name: str) -> set[MemberState | None]:
        return {s.view.state_of(NodeId(name)) for a, s in self.nodes.items() if a not in self.down}
