"""The member table: SWIM states merged by incarnation, as an immutable, state-based CRDT.

Pure: no clocks, no I/O. The caller hands in `now` (seconds on any monotonic clock).

Each entry joins two independent lattices, which is why merging is commutative, associative
and idempotent:

* its state, ordered by (incarnation, rank) with alive < suspect < dead < left, so suspicion
  overrides alive at the same incarnation and only a higher incarnation (a refutation)
  overrides suspect, dead or left;
* its record, the newest `MemberRecord` seen (highest incarnation; a deterministic tie-break
  when a node restarted and reused an incarnation with other contents).

A suspicion or death can arrive before the member's record does; the entry then holds no record
and is not listed as a member until an `Alive` arrives. `state_since` is local knowledge (when
this node saw the state change) and does not travel. Forgetting dead and left members after
`dead_reclaim_s` is the one non-monotone step, as in memberlist: a stale alive message older
than that could re-add a member, which a refutation then corrects.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from swarm.config import MembershipConfig
from swarm.membership.updates import STATE_RANK, Alive, Dead, Suspect, Update, state_update
from swarm.types import MemberRecord, MemberState, NodeId

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)
_GONE = (MemberState.DEAD, MemberState.LEFT)


@dataclass(frozen=True)
class MemberEntry:
    """One member as this node knows it."""

    node_id: NodeId
    record: MemberRecord | None  # None while only a suspicion or death has been heard
    state: MemberState
    incarnation: int  # of the state; can be above record.incarnation (suspected later)
    state_since: float  # local time this node saw the state change

    @property
    def key(self) -> tuple[int, int]:
        return (self.incarnation, STATE_RANK[self.state])

    @property
    def is_live(self) -> bool:
        """Alive or suspect: still a member, not yet declared dead."""
        return self.record is not None and self.state in _LIVE


def _newer_record(old: MemberRecord | None, new: MemberRecord) -> MemberRecord:
    if old is None or new.incarnation > old.incarnation:
        return new
    if new.incarnation < old.incarnation or new == old:
        return old
    # Same incarnation, different contents: only after a restart that lost its incarnation.
    # Any deterministic choice keeps the join commutative; the member refutes either way.
    return max(old, new, key=repr)


def join_entry(old: MemberEntry | None, update: Update, now: float) -> MemberEntry:
    """The least entry that knows both `old` and `update`."""
    if old is None:
        record = update.record if isinstance(update, Alive) else None
        return MemberEntry(update.node_id, record, update.state, update.incarnation, now)
    entry = old
    if isinstance(update, Alive):
        record = _newer_record(old.record, update.record)
        if record is not old.record:
            entry = replace(entry, record=record)
    if (update.incarnation, STATE_RANK[update.state]) > old.key:
        entry = replace(entry, state=update.state, incarnation=update.incarnation, state_since=now)
    return entry


@dataclass(frozen=True)
class MembershipView:
    """An immutable member table. Build with `MembershipView.of(records, now)` or `empty()`."""

    entries: Mapping[NodeId, MemberEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.entries, MappingProxyType):  # read-only to every caller
            object.__setattr__(self, "entries", MappingProxyType(dict(self.entries)))

    @classmethod
    def empty(cls) -> MembershipView:
        return cls()

    @classmethod
    def of(cls, records: Iterable[MemberRecord], now: float) -> MembershipView:
        view = cls()
        for record in records:
            view, _ = view.apply(Alive(record), now)
        return view

    # ---- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.entries

    def __iter__(self) -> Iterator[MemberEntry]:
        return iter(self.entries.values())

    def get(self, node_id: NodeId) -> MemberEntry | None:
        return self.entries.get(node_id)

    def state_of(self, node_id: NodeId) -> MemberState | None:
        entry = self.entries.get(node_id)
        return None if entry is None or entry.record is None else entry.state

    def alive_members(self) -> tuple[MemberRecord, ...]:
        """Members in state alive (not suspect), sorted by node id."""
        return self._records(lambda e: e.state is MemberState.ALIVE)

    def live_members(self) -> tuple[MemberRecord, ...]:
        """Alive or suspect: what placement should plan with (a suspicion is not a death)."""
        return self._records(lambda e: e.state in _LIVE)

    def _records(self, keep: Callable[[MemberEntry], bool]) -> tuple[MemberRecord, ...]:
        return tuple(
            e.record for _, e in sorted(self.entries.items()) if e.record is not None and keep(e)
        )

    @cached_property
    def live_ids(self) -> tuple[NodeId, ...]:
        """Ids of alive and suspect members with a record, sorted; cached (the view is frozen)."""
        return tuple(sorted(n for n, e in self.entries.items() if e.is_live))

    @cached_property
    def _unsettled_ids(self) -> frozenset[NodeId]:
        return frozenset(n for n, e in self.entries.items() if e.state is not MemberState.ALIVE)

    @property
    def _unsettled(self) -> tuple[MemberEntry, ...]:
        return tuple(self.entries[n] for n in sorted(self._unsettled_ids))

    def _carry_caches(
        self, parent: MembershipView, old: MemberEntry | None, new: MemberEntry
    ) -> None:
        """Derive the parent's cached indexes for a one-entry change instead of rescanning
        every entry: views change per update, and large swarms apply many updates."""
        cache = parent.__dict__
        node_id = new.node_id
        if "live_ids" in cache:
            ids: tuple[NodeId, ...] = cache["live_ids"]
            was, is_now = old is not None and old.is_live, new.is_live
            if is_now and not was:
                at = bisect.bisect_left(ids, node_id)
                ids = (*ids[:at], node_id, *ids[at:])
            elif was and not is_now:
                ids = tuple(i for i in ids if i != node_id)
            self.__dict__["live_ids"] = ids
        if "_unsettled_ids" in cache:
            unsettled: frozenset[NodeId] = cache["_unsettled_ids"]
            settled = new.state is MemberState.ALIVE
            if settled and node_id in unsettled:
                unsettled = unsettled - {node_id}
            elif not settled and node_id not in unsettled:
                unsettled = unsettled | {node_id}
            self.__dict__["_unsettled_ids"] = unsettled

    # ---- merging -------------------------------------------------------------------------

    def apply(self, update: Update, now: float) -> tuple[MembershipView, bool]:
        """Join one update; returns the new view and whether anything changed."""
        old = self.entries.get(update.node_id)
        new = join_entry(old, update, now)
        if new is old:
            return self, False
        entries = dict(self.entries)
        entries[update.node_id] = new
        view = MembershipView(MappingProxyType(entries))
        view._carry_caches(self, old, new)
        return view, True

    def apply_all(
        self, updates: Iterable[Update], now: float
    ) -> tuple[MembershipView, tuple[Update, ...]]:
        """Join many updates; returns the new view and the updates that changed it, in order."""
        view = self
        changed: list[Update] = []
        for update in updates:
            view, did = view.apply(update, now)
            if did:
                changed.append(update)
        return view, tuple(changed)

    def full_state(self, local_id: NodeId) -> tuple[Update, ...]:
        """Everything this view knows, as updates, for a push-pull exchange."""
        out: list[Update] = []
        for _, entry in sorted(self.entries.items()):
            if entry.record is not None:
                out.append(Alive(entry.record))
            if entry.state is not MemberState.ALIVE:
                out.append(state_update(entry.node_id, entry.state, entry.incarnation, local_id))
        return tuple(out)

    def merge_full_state(
        self, updates: Iterable[Update], now: float
    ) -> tuple[MembershipView, tuple[Update, ...]]:
        """Join a peer's full state. As in memberlist, a peer's `dead` is taken as `suspect`,
        so a node that missed the death runs its own suspicion timer instead of trusting a
        possibly stale verdict; `left` is taken as is."""
        return self.apply_all((soften_dead(u) for u in updates), now)

    # ---- time ----------------------------------------------------------------------------

    def tick(
        self, now: float, config: MembershipConfig, local_id: NodeId
    ) -> tuple[MembershipView, tuple[Dead, ...]]:
        """Suspects past their timeout become dead (declared by `local_id`, returned so the
        caller can gossip them); dead and left members past `dead_reclaim_s` are forgotten."""
        if not self._unsettled:
            return self, ()
        timeout = config.suspicion_timeout_s(len(self.live_ids))
        entries: dict[NodeId, MemberEntry] | None = None
        declared: list[Dead] = []
        for entry in self._unsettled:
            # `state_since + x <= now`, the very sum next_deadline returns: `now - state_since`
            # can round below x, and a driver woken at the deadline would spin
            if entry.state is MemberState.SUSPECT and entry.state_since + timeout <= now:
                entries = dict(self.entries) if entries is None else entries
                entries[entry.node_id] = replace(entry, state=MemberState.DEAD, state_since=now)
                if entry.record is not None:  # no news worth gossiping about a stranger
                    declared.append(Dead(entry.node_id, entry.incarnation, local_id))
            elif entry.state in _GONE and entry.state_since + config.dead_reclaim_s <= now:
                entries = dict(self.entries) if entries is None else entries
                del entries[entry.node_id]
        if entries is None:
            return self, ()
        return MembershipView(MappingProxyType(entries)), tuple(declared)

    def recently_gone(
        self, now: float, within: float, state: MemberState = MemberState.DEAD
    ) -> tuple[NodeId, ...]:
        """Members with a record that entered `state` (dead or left) less than `within` ago."""
        return tuple(
            sorted(
                e.node_id
                for e in self._unsettled
                if e.state is state and e.record is not None and now - e.state_since < within
            )
        )

    def next_deadline(self, config: MembershipConfig) -> float | None:
        """The earliest `now` at which `tick` would change something, if any."""
        if not self._unsettled:
            return None
        timeout = config.suspicion_timeout_s(len(self.live_ids))
        return min(
            e.state_since + (timeout if e.state is MemberState.SUSPECT else config.dead_reclaim_s)
            for e in self._unsettled
        )


def soften_dead(update: Update) -> Update:
    """A peer's `dead` as a `suspect` at the same incarnation (see `merge_full_state`)."""
    if isinstance(update, Dead):
        return Suspect(update.node_id, update.incarnation, update.from_node)
    return update


def refute(local: MemberRecord, update: Update, leaving: bool = False) -> MemberRecord | None:
    """The local node's answer to an update about itself: its record at a higher incarnation
    when the update would otherwise stick (a suspicion, a death, a leave it did not announce,
    or a stale or foreign record under its name); None when nothing needs refuting."""
    if update.node_id != local.node_id or leaving:
        return None
    if isinstance(update, Alive):
        if update.record == local or update.incarnation < local.incarnation:
            return None
    elif update.incarnation < local.incarnation:
        return None
    return replace(local, incarnation=max(local.incarnation, update.incarnation) + 1)
