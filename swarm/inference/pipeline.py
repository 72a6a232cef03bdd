"""A pipeline carries a session's hidden states through layers 0..L-1 and back.

`LocalPipeline` chains shards in one process; the networked pipeline (across nodes) offers the
same two calls, so the generation loop does not care where the layers run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swarm.errors import SpanError
from swarm.inference.prompt_keys import block_digests, reusable_blocks
from swarm.inference.replay import replay
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.shard import Shard
from swarm.schema import RequestTrace
from swarm.types import NodeId, SessionId


@dataclass(frozen=True)
class Prefilled:
    """A session's first step: its last position's output, and how many of the prompt's
    positions came from blocks the hops kept (computed by an earlier prompt)."""

    hidden: torch.Tensor
    cached: int = 0


class Pipeline(Protocol):
    async def prefill(
        self, session: SessionId, hidden: torch.Tensor, token_ids: Sequence[int] | None
    ) -> Prefilled:
        """The session's first step: the prompt (`hidden`, the embeddings of `token_ids`)
        from position 0. With `token_ids`, where the pipeline keeps prompt blocks
        (runtime.prompt_cache), the session starts after the blocks every hop of its route
        keeps from an earlier prompt, and the rest of the prompt's whole blocks are kept;
        the bits are those of computing it all (`chunks.py`). None: computed whole."""
        ...

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        """Run every layer on positions [position, position + seq) of the session. `verify`:
        each position as its own decode step would (a speculative step's drafted tokens),
        every position returned; a result of one position means a hop ran it as a plain
        step (a peer that does not know verify steps), and the drafts are unverified."""
        ...

    async def prefill_rows(self, session: SessionId, hidden: torch.Tensor) -> torch.Tensor:
        """The session's prompt from position 0 as `forward` runs it, every position's
        output returned ([1, seq, hidden], each the bits that prefill gives it): an
        embedding pools them. Nothing is kept as a prompt block."""
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

    def spot_checked(self, session: SessionId, position: int) -> bool:
        """Whether the session's step at `position` is spot-checked (`spot_checks.py`): its
        result is compared with other holders' before the head may use it."""
        ...

    async def spot_check(
        self, session: SessionId, everything: torch.Tensor, prefilled: int, output: torch.Tensor
    ) -> None:
        """Compare `output` (a checked step's last position, [1, 1, hidden]) with the same
        position run through other holders from `everything` (every token up to it,
        embedded; the first `prefilled` the prompt). HopFailedError naming a hop of the
        session's route that a verdict found wrong: recover and replay as after a failure."""
        ...

    def record_head(self, session: SessionId, ms: float, within_step: bool = False) -> None:
        """What the head, sampling and the next embedding of a decode step took, for the
        session's timeline where the pipeline keeps one; `within_step`: they ran as the
        step's result arrived, inside the time the step took."""
        ...


class LocalPipeline:
    def __init__(
        self,
        shards: Sequence[Shard],
        compute: ComputeThread,
        chunk_tokens: int,
        keep_prompts: bool = False,
    ) -> None:
        """`keep_prompts`: keep prompt blocks in the shards' caches and start from them
        (runtime.prompt_cache)."""
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
        self._keep_prompts = keep_prompts

    async def prefill(
        self, session: SessionId, hidden: torch.Tensor, token_ids: Sequence[int] | None
    ) -> Prefilled:
        if token_ids is None or not self._keep_prompts:
            return Prefilled(await self.forward(session, hidden, 0))
        size = self._chunk_tokens
        digests = block_digests(token_ids, size, f"{size}:local")
        held = await self._compute.run(self._held, digests)
        start = reusable_blocks(held, hidden.shape[1], size) * size
        if start:
            for shard in self.shards:
                await self._compute.run(
                    shard.adopt_prefix, session, digests[: start // size], shard.span
                )
        out = hidden
        for a, b in prefill_chunks(hidden.shape[1] - start, size, start):
            at = start + a
            out = hidden[:, at : start + b]
            for shard in self.shards:
                out = await self._compute.run(shard.forward, session, out, at)
                if b - a == size:  # a whole block
                    await self._compute.run(shard.kv.keep, session, digests[at // size], at, size)
        return Prefilled(out, start)

    def _held(self, digests: Sequence[str]) -> int:
        return min(shard.kv.prefixes.held(digests, shard.span) for shard in self.shards)

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        if verify:
            for shard in self.shards:
                hidden = await self._compute.run(shard.verify, session, hidden, position)
            return hidden
        outs = await self._chunks(session, hidden, position)
        return outs[-1] if outs else hidden  # the last chunk's: its last position is the step's

    async def prefill_rows(self, session: SessionId, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat(await self._chunks(session, hidden, 0), dim=1)

    async def _chunks(
        self, session: SessionId, hidden: torch.Tensor, position: int
    ) -> list[torch.Tensor]:
        """Each prefill chunk's output, in order."""
        outs = []
        for start, end in prefill_chunks(hidden.shape[1], self._chunk_tokens, position):
            out = hidden[:, start:end]
            for shard in self.shards:
                out = await self._compute.run(shard.forward, session, out, position + start)
            outs.append(out)
        return outs

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

    def spot_checked(self, session: SessionId, position: int) -> bool:
        """One process has no other holder to compare with."""
        return False

    async def spot_check(
        self, session: SessionId, everything: torch.Tensor, prefilled: int, output: torch.Tensor
    ) -> None:
        """Never asked: nothing is spot-checked here."""

    def record_head(self, session: SessionId, ms: float, within_step: bool = False) -> None:
        """One process keeps no timeline."""
