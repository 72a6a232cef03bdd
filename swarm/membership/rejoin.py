"""Healing: the addresses of members this node has seen, and when to knock on them again.

SWIM heals a short partition by itself (each side refutes the other's verdict at the next full
sync), but a side that lasted past `dead_reclaim_s` has forgotten the other side, and nobody
is left to sync with. Like serf, which keeps trying failed members for hours, a node remembers
every address it saw alive and, while some remembered or bootstrap address has no live member
in its view, sends a join to a few of them on a timer that backs off from
`rejoin_interval_s` to `rejoin_max_interval_s`. An address is forgotten once it has not been
seen alive for `remember_for_s`, or when its member left gracefully.

Pure: the protocol calls these at its probe cadence with its own clock; the gossiper keeps
the addresses on disk (`swarm.membership.remembered_file`) so that a restart still knows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from swarm.config import MembershipConfig
from swarm.membership.view import MembershipView
from swarm.types import MemberState

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


@dataclass(frozen=True)
class Remembered:
    seen: tuple[tuple[str, float], ...] = ()  # (address, when last seen alive), by address
    next_at: float = 0.0  # no knock before this (seconds on the protocol's clock)
    attempt: int = 0  # knocks since every remembered address was last live

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(address for address, _ in self.seen)


def remember(
    remembered: Remembered,
    view: MembershipView,
    me: str,
    now: float,
    config: MembershipConfig,
) -> Remembered:
    """Mark the addresses of live members seen at `now`; drop those that left gracefully or
    were not seen alive for `remember_for_s`. This node's own address is never kept."""
    seen = dict(remembered.seen)
    for entry in view:
        record = entry.record
        if record is None or record.address == me:
            continue
        if entry.state in _LIVE:
            seen[record.address] = now
        elif entry.state is MemberState.LEFT:
            seen.pop(record.address, None)
    kept = tuple(
        (address, at)
        for address, at in sorted(seen.items())
        if now - at <= config.remember_for_s and address != me
    )
    return remembered if kept == remembered.seen else replace(remembered, seen=kept)


def missing(
    remembered: Remembered, view: MembershipView, seeds: Iterable[str], me: str
) -> list[str]:
    """Remembered and bootstrap addresses that no live member of the view has, sorted."""
    live = {e.record.address for e in view if e.record is not None and e.state in _LIVE}
    wanted = set(remembered.addresses) | set(seeds)
    return sorted(a for a in wanted if a not in live and a != me)


def knock(
    remembered: Remembered, absent: Sequence[str], now: float, config: MembershipConfig
) -> tuple[Remembered, tuple[str, ...]]:
    """Whom to send a join now, and the state for the next call. While nothing is absent the
    next knock stays one `rejoin_interval_s` away (a member that merely restarts on its old
    address has that long to come back by itself); once due, the next `rejoin_fanout` absent
    addresses in turn (so every one is tried), the wait doubling up to
    `rejoin_max_interval_s`."""
    if not absent:
        return Remembered(remembered.seen, now + config.rejoin_interval_s, 0), ()
    if now < remembered.next_at:
        return remembered, ()
    fanout = min(max(1, config.rejoin_fanout), len(absent))
    start = (remembered.attempt * fanout) % len(absent)
    targets = tuple((list(absent) * 2)[start : start + fanout])
    wait = _backoff(remembered.attempt, config)
    return Remembered(remembered.seen, now + wait, remembered.attempt + 1), targets


@dataclass(frozen=True)
class Unanswered:
    """The warnings about one bootstrap address whose joins go unanswered."""

    warned: int = 0  # warnings logged so far
    next_at: float = 0.0  # no warning before this (seconds on the gossiper's clock)


def warn_unanswered(
    unanswered: Unanswered, now: float, config: MembershipConfig
) -> tuple[Unanswered, bool]:
    """Whether a join to a bootstrap address that went unanswered (or was refused) is logged
    now, and the state for the next. The joins go every probe interval while this node knows
    no one; the warnings back off as the knocks do: the first at once, then after
    `rejoin_interval_s`, the wait doubling up to `rejoin_max_interval_s`, so a node left
    alone says why every few seconds at first and never floods the log."""
    if now < unanswered.next_at:
        return unanswered, False
    return Unanswered(unanswered.warned + 1, now + _backoff(unanswered.warned, config)), True


def _backoff(attempt: int, config: MembershipConfig) -> float:
    """Seconds before the next try after `attempt` earlier ones."""
    doubled: float = config.rejoin_interval_s * 2 ** min(attempt, 30)
    return min(config.rejoin_max_interval_s, doubled)
