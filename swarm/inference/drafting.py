"""Drafting for speculative decoding at the entry, as pure state: no model, no clock.

`NgramDrafter` proposes the tokens that followed the latest earlier occurrence of the text's
end (its last `ngram_max` tokens, then shorter ends down to `ngram_min`) in the prompt and
the tokens generated so far: edits, quotes and repeated structure repeat whole runs.
`DraftLength` picks how many of them a step sends, from what this session measured: how
often the target accepted drafts, and what a verify step of n positions costs against a
one-position step; the length with the most tokens per millisecond wins, and when none
beats a plain step, drafting pauses for `pause_steps` steps (twice as long after each
pause in a row), after which one verify step measures again (with as many drafts as the
first draft's chance of the longest: half of it at first; on open-ended text most lookups
miss).
Where the entry has a draft model (swarm.runtime.execution.draft_model), it drafts when
the lookup finds nothing, its length adapted apart, its drafting time counted in its steps'."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from swarm.config import SpeculationConfig
from swarm.schema import SpeculationReport

_MAX_DOUBLINGS = 5  # a pause grows to at most 32 times speculation.pause_steps


class NgramDrafter:
    """The index of every n-gram of the sequence by where it last ended, grown as tokens
    arrive: a lookup costs the same however long the sequence."""

    def __init__(self, config: SpeculationConfig) -> None:
        self._sizes = range(config.ngram_max, config.ngram_min - 1, -1)
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> the index after its last end
        # an n-gram's first n - 1 tokens -> the tokens that followed them (its last ones)
        self._followers: dict[tuple[int, ...], set[int]] = {}
        self._indexed = 0  # n-grams ending at or before this index are in _ends

    def _index(self, tokens: Sequence[int], last_stop: int) -> None:
        """Index the n-grams of `tokens` ending at or before `last_stop`."""
        for stop in range(self._indexed + 1, last_stop + 1):
            for n in self._sizes:
                if stop >= n:
                    gram = tuple(tokens[stop - n : stop])
                    self._ends[gram] = stop
                    self._followers.setdefault(gram[:-1], set()).add(gram[-1])
        self._indexed = max(self._indexed, last_stop)

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens to follow `tokens` (the whole sequence so far)."""
        end = len(tokens)
        self._index(tokens, end - 1)  # the text's own end is not an earlier one
        if limit <= 0:
            return []
        for n in self._sizes:
            if end < n:
                continue
            found = self._ends.get(tuple(tokens[end - n :]))
            if found is not None:
                return list(tokens[found : found + limit])
        return []

    def hits_after(self, tokens: Sequence[int]) -> frozenset[int]:
        """The tokens t for which `propose(tokens + [t], limit > 0)` finds a continuation:
        those that followed an earlier occurrence of one of the text's ends."""
        end = len(tokens)
        self._index(tokens, end)  # what the lookup after one more token indexes first
        hits: set[int] = set()
        for n in self._sizes:
            if end >= n - 1:
                hits |= self._followers.get(tuple(tokens[end - n + 1 :]), set())
        return frozenset(hits)


@dataclass
class DraftLength:
    """How many drafted tokens this session's next step should carry (0: a plain step).

    A lookup's drafts tend to be right for a whole run or wrong from the first token, so
    the first draft's chance (`first`) and the chance of each one after an accepted draft
    (`next`) are measured apart: k drafts then yield 1 + first * (1 + next + ... +
    next^(k-1)) tokens on average."""

    config: SpeculationConfig
    first_taken: float = 1.0  # smoothed: the first draft accepted (a prior of one in two)
    first_tried: float = 2.0
    next_taken: float = 3.0  # smoothed: a later draft accepted (a prior of three in four)
    next_tried: float = 4.0
    plain_ms: float | None = None  # smoothed ms of a one-position step, head included
    per_row_ms: float | None = None  # smoothed ms each further position of a verify adds
    paused: int = 0  # steps left without drafting
    misses: int = 0  # pauses in a row (each doubles the next, up to _MAX_DOUBLINGS times)

    def expected_tokens(self, k: int) -> float:
        first = self.first_taken / self.first_tried
        later = min(self.next_taken / self.next_tried, 0.99)
        return 1 + first * (1 - later**k) / (1 - later) if k else 1.0

    def choose(self) -> int:
        if self.paused > 0 or self.plain_ms is None:  # no plain step measured yet: measure one
            return 0
        if self.per_row_ms is None:  # no verify measured yet: try as many as the first
            # draft's measured chance of the longest (half of it at first), so that where
            # drafts have missed, a probe costs little
            first = self.first_taken / self.first_tried
            return max(1, math.ceil(self.config.max_draft_tokens * first))
        best, best_rate = 0, 1.0 / self.plain_ms
        for k in range(1, self.config.max_draft_tokens + 1):
            rate = self.expected_tokens(k) / (self.plain_ms + k * self.per_row_ms)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def pauses_past_next(self) -> bool:
        """Whether the step after the next plain one drafts nothing, whatever that one
        measures (`choose` is 0 while paused, and a plain step ends one step of a pause)."""
        return self.paused >= 2

    def observe_plain(self, ms: float) -> None:
        if self.paused > 0:
            self.paused -= 1
        self.plain_ms = self._smooth(self.plain_ms, ms)

    def observe_verify(self, drafted: int, accepted: int, ms: float) -> None:
        """A verify step of `drafted` drafts, `accepted` of them taken, that took `ms`."""
        a = self.config.smoothing
        self.first_taken += a * ((1.0 if accepted else 0.0) - self.first_taken)
        self.first_tried += a * (1.0 - self.first_tried)
        if accepted:  # the later drafts looked at: those taken, and the first rejected
            looked = accepted - 1 + (1 if accepted < drafted else 0)
            self.next_taken += a * (accepted - 1 - self.next_taken)
            self.next_tried += a * (looked - self.next_tried)
        if self.plain_ms is not None:
            extra = max(0.0, (ms - self.plain_ms) / drafted)
            self.per_row_ms = self._smooth(self.per_row_ms, extra)
            # where no length pays now (the step itself may have paid: the priors are
            # cautious after one measure), pause and measure again later; without the pause
            # a session that measured once would never draft again
            if self.choose() == 0:
                self.paused = self.config.pause_steps * 2 ** min(self.misses, _MAX_DOUBLINGS)
                self.misses += 1
                self.per_row_ms = None  # measured afresh when drafting resumes
            else:
                self.misses = 0

    def carried_over(self) -> DraftLength:
        """What a new session of the same entry starts from, where this one has ended: its
        acceptance and the steps left of its pause, with the costs measured afresh (a new
        session has its own route). For the draft model, whose drafts cost time: without
        this, every short answer would pay again for finding out that drafts miss."""
        return replace(self, plain_ms=None, per_row_ms=None)

    def _smooth(self, last: float | None, new: float) -> float:
        return new if last is None else last + self.config.smoothing * (new - last)


DraftSource = Literal["lookup", "model"]


class Speculation:
    """One session's drafting: the lookup, tried first (it costs nothing), then the draft
    model where the entry has one; each source with its own adapted length, since their
    acceptance differs and only the model's drafts cost time to make."""

    def __init__(
        self, config: SpeculationConfig, model: bool = False, carried: DraftLength | None = None
    ) -> None:
        """`model`: the entry has a draft model; `carried`: its length as the entry's last
        finished session left it."""
        self._drafter = NgramDrafter(config)
        self.length = DraftLength(config)
        self.model_length = None
        if model:
            self.model_length = DraftLength(config) if carried is None else carried.carried_over()

    def drafts(self, tokens: Sequence[int], room: int) -> list[int]:
        """What the lookup would have the next step verify after `tokens`; at most `room`."""
        return self._drafter.propose(tokens, min(self.length.choose(), room))

    def drafting_tokens(self, tokens: Sequence[int], room: int) -> frozenset[int] | None:
        """Before a plain step whose token is not sampled yet: the tokens after which the
        step that follows it may carry drafts (None: any token may), `room` the drafts it
        could carry at most. A pause that outlasts the step ahead drafts nothing; a draft
        model drafts wherever the lookup misses."""
        if room <= 0:
            return frozenset()
        if self.model_length is not None and not self.model_length.pauses_past_next():
            return None
        if self.length.pauses_past_next():
            return frozenset()
        return self._drafter.hits_after(tokens)

    def model_drafts(self, room: int) -> int:
        """How many tokens the draft model should propose (0: none, or no draft model)."""
        return 0 if self.model_length is None else min(self.model_length.choose(), room)

    def observe(
        self, drafted: int, accepted: int, ms: float, source: DraftSource = "lookup"
    ) -> None:
        """A step of `drafted` drafts from `source`; `ms` includes the time making them."""
        if drafted:
            length = self.model_length if source == "model" else self.length
            assert length is not None, "model drafts without a draft model"
            length.observe_verify(drafted, accepted, ms)
            return
        for length in (self.length, self.model_length):
            if length is not None:
                length.observe_plain(ms)


@dataclass
class DraftCounts:
    """What an entry's sessions drafted and the target accepted, since the node started."""

    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    # verify steps whose drafts came back unverified: replayed after a hop failed (the
    # replay returns the last accepted position only), or run by a peer without verify steps
    unverified: int = 0

    model_drafted: int = 0  # of `drafted`, the tokens the draft model made
    model_accepted: int = 0  # of `accepted`, the draft model's

    def add(self, drafted: int, accepted: int, source: DraftSource = "lookup") -> None:
        self.verify_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        if source == "model":
            self.model_drafted += drafted
            self.model_accepted += accepted

    def report(self, draft_model: str) -> SpeculationReport:
        """The counts as /status, /metrics and the dashboard show them; `draft_model`: the
        entry's, as configured ("" for none)."""
        mean = self.accepted / self.verify_steps if self.verify_steps else 0.0
        return SpeculationReport(
            self.verify_steps,
            self.drafted,
            self.accepted,
            mean,
            self.unverified,
            draft_model,
            self.model_drafted,
            self.model_accepted,
        )
