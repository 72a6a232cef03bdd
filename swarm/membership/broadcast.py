"""The piggyback queue: which updates ride on the next outgoing message.

memberlist's TransmitLimitedQueue, as an immutable value. Each update is sent at most
`retransmit_mult * ceil(log10(n + 1))` times, the least-sent first and among those the newest
first, within a count and a byte budget per message. A newer update about a member replaces a
queued one about the same member, so a refutation never queues behind the suspicion it answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from swarm.membership.updates import Alive, Update
from swarm.types import NodeId

SizeOf = Callable[[Update], int]


def retransmit_limit(retransmit_mult: int, members: int) -> int:
    """How many times one update is sent, for a cluster of `members` (memberlist's rule)."""
    return retransmit_mult * max(1, math.ceil(math.log10(members + 1)))


def estimated_size(update: Update) -> int:
    """A rough encoded size in bytes, for budgets before the wire layer can say exactly."""
    return 320 if isinstance(update, Alive) else 64


@dataclass(frozen=True)
class Queued:
    update: Update
    transmits: int  # times sent so far
    order: int  # enqueue order; higher is newer


@dataclass(frozen=True)
class BroadcastQueue:
    items: tuple[Queued, ...] = ()
    next_order: int = 0
    max_items: int = 1024  # the oldest, most-sent updates are dropped beyond this

    def __len__(self) -> int:
        return len(self.items)

    def push(self, update: Update) -> BroadcastQueue:
        """Queue an update for gossip, replacing any queued update about the same member."""
        kept = tuple(q for q in self.items if q.update.node_id != update.node_id)
        items = (*kept, Queued(update, 0, self.next_order))
        if len(items) > self.max_items:
            items = tuple(sorted(items, key=_priority)[: self.max_items])
        return BroadcastQueue(items, self.next_order + 1, self.max_items)

    def about(self, node_id: NodeId) -> Update | None:
        for q in self.items:
            if q.update.node_id == node_id:
                return q.update
        return None

    def take(
        self,
        members: int,
        retransmit_mult: int,
        max_count: int,
        max_bytes: int,
        size_of: SizeOf = estimated_size,
    ) -> tuple[BroadcastQueue, tuple[Update, ...]]:
        """Updates for one message, counting them as sent once more; spent ones leave."""
        if not self.items or max_count <= 0:
            return self, ()
        limit = retransmit_limit(retransmit_mult, members)
        chosen: list[Queued] = []
        used = 0
        for q in sorted(self.items, key=_priority):
            if len(chosen) >= max_count:
                break
            size = size_of(q.update)
            if used + size > max_bytes:
                continue
            used += size
            chosen.append(q)
        if not chosen:
            return self, ()
        sent = {id(q) for q in chosen}
        items = tuple(
            q if id(q) not in sent else Queued(q.update, q.transmits + 1, q.order)
            for q in self.items
        )
        items = tuple(q for q in items if q.transmits < limit)
        return BroadcastQueue(items, self.next_order, self.max_items), tuple(
            q.update for q in chosen
        )


def _priority(q: Queued) -> tuple[int, int]:
    return (q.transmits, -q.order)
