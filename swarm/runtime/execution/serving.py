"""What a node serves: its current shard and the shards it is moving away from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import heap
from swarm.types import LayerSpan, SessionId


@dataclass
class Serving:
    """The shard this node announces, plus shards it moved away from that still hold sessions
    in flight (make-before-break: a moved node finishes what it started). Touched only on the
    compute thread, which owns the shards' KV caches."""

    shard: Shard | None = None
    retiring: list[Shard] = field(default_factory=list)
    _retired_at: dict[int, float] = field(default_factory=dict)  # id(shard) -> when it retired

    @property
    def span(self) -> LayerSpan | None:
        return None if self.shard is None else self.shard.span

    def all(self) -> list[Shard]:
        return [s for s in (self.shard, *self.retiring) if s is not None]

    def shard_for(self, session: SessionId, layers: LayerSpan) -> Shard | None:
        """A shard covering `layers`: the one already holding the session if any."""
        if not self.retiring:  # the common case, asked twice a decode step: no lists
            shard = self.shard
            if shard is None or layers.start < shard.span.start or shard.span.end < layers.end:
                return None
            return shard
        covering = [
            s for s in self.all() if s.span.start <= layers.start and layers.end <= s.span.end
        ]
        holding = [s for s in covering if s.has_session(session)]
        candidates = holding or covering
        return candidates[0] if candidates else None

    def move_to(self, shard: Shard, now: float = 0.0, *, finish: bool = True) -> None:
        """Serve `shard` from now on. `finish`: the shard served until now finishes the
        sessions it holds (a move). Without it, it and the retiring shards are dropped at
        once (a reload: blocks found computing wrong bits finish nothing; their sessions'
        next steps fail, and their entries replay them on fresh blocks)."""
        if not finish:
            self.shard, self.retiring = shard, []
            self._retired_at.clear()
            heap.trim()  # the dropped layers' bytes back to the system
            return
        if self.shard is not None:
            self.retiring.append(self.shard)
            self._retired_at[id(self.shard)] = now
        self.shard = shard

    def release_idle(
        self,
        now: float = 0.0,
        grace_s: float = 0.0,
        covered_elsewhere: Callable[[LayerSpan], bool] = lambda span: True,
    ) -> list[LayerSpan]:
        """Drop retiring shards that no session uses, that retired at least `grace_s` ago
        (entries whose view still shows the old span keep routing to it for a moment), and
        whose layers, beyond the current span, other nodes serve."""
        idle = [
            s
            for s in self.retiring
            if not s.kv.sessions()
            and now - self._retired_at.get(id(s), now) >= grace_s
            and all(
                covered_elsewhere(LayerSpan(layer, layer + 1))
                for layer in s.span
                if self.span is None or layer not in self.span
            )
        ]
        self.retiring = [s for s in self.retiring if s not in idle]
        for s in idle:
            self._retired_at.pop(id(s), None)
        released = [s.span for s in idle]
        if released:
            del idle, s  # the last references to the dropped layers' tensors
            heap.trim()  # else the heap keeps ~a third of their bytes resident
        return released
