"""Spot-checks: the entry re-runs a sampled share of its steps on other holders of the same
layers and compares the bits.

swarm's kernels give the same bits on every holder of a layer, through any split, for a
decode row or a prefill chunk alike (`tests/test_exact_match.py`), so a step's output is a
function of the tokens before it: a node whose memory or stored weights went bad computes
fluent, wrong text that nothing else would notice. A sampled step's output is compared with
a shadow session's, replayed (`replay.py`) from position 0 through a route that leaves out
one hop of the live route: the same bytes, or evidence against one side. Evidence is not a
verdict: a third route without the hops the two differ in decides, and the side it agrees
with is right (`verdict`). The members it names are asked to reload their layers from their
stores (digests checked) and left out of routes until they say they did, or start again
(`Convictions`, `lifted`); a member asked reloads a span at most once in a while
(`reload_refusal`). A member that was on the losing side of a check no third route could
decide, or that was let back in, is checked more often (`check_every`).

The pure parts are here (which steps, which hop, whose fault); the entry's pipeline
(`remote.py`) gathers the results and acts."""

from __future__ import annotations

import dataclasses
import enum
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from swarm.types import LayerSpan, NodeId


class Outcome(enum.Enum):
    AGREE = "agree"  # every result has the same bytes
    CONVICTED = "convicted"  # a majority agrees; the members only the minority ran are wrong
    UNDECIDED = "undecided"  # the results differ and no majority says whose is right


@dataclass(frozen=True)
class Result:
    """One run of a checked step: the members whose layers made it, and its output's bytes."""

    route: frozenset[NodeId]
    output: bytes


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    # CONVICTED: the members whose result differs from the majority's; UNDECIDED: the
    # members the differing results do not share (one of them is wrong)
    members: frozenset[NodeId] = frozenset()


def sampled(session: str, position: int, every: int) -> bool:
    """Whether the step of `session` starting at `position` is checked: one step in
    `every` on average (0: none, 1: all). A hash of the two, not a draw, so the choice is
    the same wherever it is asked, and a test can name the steps that are checked."""
    if every <= 0:
        return False
    return zlib.crc32(f"{session}:{position}".encode()) % every == 0


def check_every(
    route: Collection[NodeId], flagged: Collection[NodeId], every: int, every_flagged: int
) -> int:
    """The share of steps checked through `route` (one in so many; 0: none): the higher
    rate `every_flagged` where a hop of it is flagged (it lost a check that could not be
    decided, or it was convicted and started again), else `every`."""
    if every <= 0:
        return 0
    if any(node in flagged for node in route):
        return min(every, every_flagged)
    return every


def check_order(hops: Sequence[NodeId], flagged: Collection[NodeId], position: int) -> list[int]:
    """The indices of the hops a check may leave out of its shadow route, in the order to
    try them (the first with another holder of its layers is checked): flagged hops first,
    then each hop in turn as the positions go by, so every hop of a long session is
    checked."""
    turn = [(position + i) % len(hops) for i in range(len(hops))]
    return [i for i in turn if hops[i] in flagged] + [i for i in turn if hops[i] not in flagged]


def verdict(results: Sequence[Result]) -> Verdict:
    """Whose result is wrong, from two or three runs of one step. The bytes most runs agree
    on (more runs than any other bytes) are right; the members of the other runs that no
    agreeing run went through are wrong. No such majority (two runs that differ, three
    that all differ), or wrong results that every member of also made right ones (a fault
    that comes and goes): undecided, naming the members the runs do not all share."""
    outputs = {r.output for r in results}
    if len(outputs) <= 1:
        return Verdict(Outcome.AGREE)
    counts = {o: sum(r.output == o for r in results) for o in outputs}
    ranked = sorted(counts.values(), reverse=True)
    shared = frozenset.intersection(*(r.route for r in results))
    everyone = frozenset.union(*(r.route for r in results))
    if ranked[0] == ranked[1]:
        return Verdict(Outcome.UNDECIDED, everyone - shared)
    right = max(counts, key=lambda o: counts[o])
    cleared = frozenset().union(*(r.route for r in results if r.output == right))
    wrong = frozenset().union(*(r.route for r in results if r.output != right)) - cleared
    if not wrong:
        return Verdict(Outcome.UNDECIDED, everyone - shared)
    return Verdict(Outcome.CONVICTED, wrong)


def third_route_excludes(live: frozenset[NodeId], shadow: frozenset[NodeId]) -> frozenset[NodeId]:
    """The members a deciding run leaves out: those only one of the two runs went through
    (one of them is wrong); the ones both ran are common to every run and decide nothing."""
    return live ^ shadow


@dataclass(frozen=True)
class Conviction:
    reloads: int  # the reloads the member announced when it was convicted
    gone: bool = False  # the view has lost it since: it stopped, or was declared dead


def lifted(conviction: Conviction, standing: bool, reloads: int) -> bool:
    """Whether a conviction is over, for a member the view holds alive or suspect now
    (`standing`) announcing `reloads`: it started again (the view lost it and holds it
    again: a new process, which re-read its stored parts), or it announces more reloads than
    when it was convicted (it re-read its span from its store, digests checked, into fresh
    blocks). Not by incarnation: a busy member that refutes a suspicion raises its own and
    computes as wrong as before."""
    return standing and (conviction.gone or reloads > conviction.reloads)


@dataclass
class Convictions:
    """Members a verdict named, left out of routes until `lifted`. A member let back in is
    flagged, checked at the higher rate from then on; `flagged` also holds the members of
    checks no third run could decide."""

    convicted: dict[NodeId, Conviction] = field(default_factory=dict)
    flagged: set[NodeId] = field(default_factory=set)

    def convict(self, node: NodeId, reloads: int) -> bool:
        """Convict `node`, which announced `reloads` as the checked step ran (a verdict on a
        step run before a reload is lifted by it); whether it was not convicted yet (a
        member is asked to reload once per conviction)."""
        held = self.convicted.get(node)
        self.convicted[node] = Conviction(reloads if held is None else max(reloads, held.reloads))
        self.flagged.add(node)
        return held is None

    def current(self, standing: Mapping[NodeId, int]) -> frozenset[NodeId]:
        """The members left out of routes now; `standing`: the members the view holds alive
        or suspect, with the reloads each announces."""
        self.convicted = {
            node: dataclasses.replace(c, gone=c.gone or node not in standing)
            for node, c in self.convicted.items()
            if not lifted(c, node in standing, standing.get(node, 0))
        }
        return frozenset(self.convicted)


def reload_refusal(
    asker_is_member: bool,
    span: LayerSpan | None,
    reloaded_at: Mapping[LayerSpan, float],
    now: float,
    every_s: float,
) -> str | None:
    """Why this node does not reload its layers at an entry's request now (None: it does):
    the asker is not a member of its view (a key holder it does not know: a node of a past
    run, or one that has not joined), it serves no layers, or it reloaded this very `span`
    less than `every_s` ago (`reloaded_at`: when each span last was, on `now`'s clock). One
    reload cures what a reload can; the same fault caught by several entries, or a fault a
    reload does not cure, would otherwise re-read the store over and over."""
    if not asker_is_member:
        return "the asker is not a member"
    if span is None:
        return "this node serves no layers"
    last = reloaded_at.get(span)
    if last is not None and now - last < every_s:
        return (
            f"layers {span} were reloaded {now - last:.0f} s ago (at most once in {every_s:.0f} s)"
        )
    return None


@dataclass
class Tally:
    """What this entry's spot-checks found since it started (for /status and /metrics)."""

    checks: int = 0  # steps run again on another route and compared
    mismatches: int = 0  # of those, the ones whose bytes differed
    undecided: int = 0  # mismatches no third run could decide
    unchecked: int = 0  # sampled steps no other route could run (no other holder, a failure)
    wrong: dict[NodeId, int] = field(default_factory=dict)  # convictions, by member
    # members asked to reload their layers (once per conviction), by member
    reloads_asked: dict[NodeId, int] = field(default_factory=dict)
