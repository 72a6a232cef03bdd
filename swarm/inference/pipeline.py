"""A pipeline carries a session's hidden states through layers 0..L-1 and back.

`LocalPipeline` chains shards in one process; the networked pipeline (across nodes) offers the
same two calls, so the generation loop does not care where the layers run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from swarm.errors import SpanError
from swarm.inference.replay import replay
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.shard import Shard
from swarm.schema import RequestTrace
from swarm.types import NodeId, SessionId


class Pipeline(Protocol):
    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        """Run every layer on positions [position, position + seq) of the session. `verify`:
        each position as its own decode step would (a speculative step's drafted tokens),
        every position returned; a result of one position means a hop ran it as a plain
        step (a peer that does not know verify steps), and the drafts are unverified."""
        ...

    async def close(self, session: SessionId) -> RequestTrace | None:
        """Free the session's caches everywhere; where it went and what its steps cost, when
        the pipeline keeps a trace."""
        ...

    async def recover(self, session: SessionId, failed: NodeId | None) -> None:
        """After a failed step: avoid `failed` (when known) and choose a new route next time."""
        ...

    async def replay(
        self, session: SessionId, hidden: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        """After `recover`: run every token of the session so far (`hidden`, their
        embeddings) on its new route from position 0, the first `prefilled` as the prefill
        that first made them and the rest as decode rows (`replay.py`), so every cache holds
        what a route that never failed holds; the last position's output."""
        ...

    def record_head(self, session: SessionId, ms: float, within_step: bool = False) -> None:
        """What the head, sampling and the next embedding of a decode step took, for the
        session's timeline where the pipeline keeps one; `within_step`: they ran as the
        step's result arrived, inside the time the step took."""
        ...


class LocalPipeline:
    def __init__(self, shards: Sequence[Shard], compute: ComputeThread, chunk_tokens: int) -> None:
        expected = 0
        for shard in shards:
            if shard.span.start != expected:
                raise SpanError(f"shard {shard.span} does not continue from layer {expected}")
            expected = shard.span.end
        if not shards or expected != shards[0].context.num_layers:
            raise SpanError(f"shards cover layers 0:{expected}, not the whole model")
        self.shards = list(shards)
        self._compute = compute
        self._chunk_tokens = chunk_tokens

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        if verify:
            for shard in self.shards:
                hidden = await self._compute.run(shard.verify, session, hidden, position)
            return hidden
        out = hidden
        for start, end in prefill_chunks(hidden.shape[1], self._chunk_tokens):
            out = hidden[:, start:end]
            for shard in self.shards:
                out = await self._compute.run(shard.forward, session, out, position + start)
        return out  # the last chunk's: its last position is the step's

    async def close(self, session: SessionId) -> RequestTrace | None:
        for shard in self.shards:
            await self._compute.run(shard.close_session, session)
        return None

    async def recover(self, session: SessionId, failed: NodeId | None) -> None:
        """Shards in one process do not fail one by one; nothing to route around."""

    async def replay(
        self, session: SessionId, hidden: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        return await replay(self.forward, session, hidden, prefilled, self._chunk_tokens)

    def record_head(self, session: SessionId, ms: float, within_step: bool = False) -> None:
        """One process keeps no timeline."""
