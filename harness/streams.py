"""A streamed answer timed as it arrives: the one loop with which benchmarks and tests read a
node's OpenAI-style stream (through `SwarmClient`, so an error event raises `SwarmError`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.schema import RequestTrace, from_json


@dataclass
class TimedStream:
    """What a stream carried so far: its text pieces, when each arrived, its usage and trace."""

    started: float = 0.0  # clock() when the request went out
    text: list[str] = field(default_factory=list)  # one piece per chunk that carried text
    stamps: list[float] = field(default_factory=list)  # clock() at each of those chunks
    usage: dict[str, Any] = field(default_factory=dict)
    trace: RequestTrace | None = None  # the final chunk's `swarm` record

    @property
    def answer(self) -> str:
        return "".join(self.text)

    @property
    def tokens(self) -> int:
        return len(self.stamps)

    def longest_wait_ms(self, after: float, none: float = 0.0) -> float:
        """The longest wait for a piece of text (from the request going out, then from piece
        to piece) that was still going on at clock() time `after`; `none` when none was."""
        times = [self.started, *self.stamps]
        waits = [(b - max(a, after)) * 1000 for a, b in itertools.pairwise(times) if b > after]
        return max(waits, default=none)

    def tokens_per_s(self) -> float:
        """Decode rate: chunks after the first over the time between the first and the last."""
        if len(self.stamps) < 2:
            raise RuntimeError(f"the stream carried {len(self.stamps)} chunks of text")
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])


def concurrent_decode_rate(streams: Sequence[TimedStream]) -> float:
    """Tokens/s of streams decoding at once, summed: the chunks stamped while every stream
    was decoding (from the last stream's first chunk to the first stream's last) over that
    window. A batched decode's steady rate, as llama-batched-bench's generation figure is:
    no prefill or request set-up in it. One stream: its `tokens_per_s`."""
    if any(len(s.stamps) < 2 for s in streams) or not streams:
        raise RuntimeError("every stream must carry two chunks of text or more")
    begin = max(s.stamps[0] for s in streams)
    end = min(s.stamps[-1] for s in streams)
    if end <= begin:
        raise RuntimeError("the streams did not decode at the same time")
    # a stream's chunks after `begin` up to `end`: each is one token decoded in the window
    tokens = sum(sum(begin < t <= end for t in s.stamps) for s in streams)
    return tokens / (end - begin)


async def follow(
    chunks: AsyncIterator[dict[str, Any]],
    into: TimedStream | None = None,
    on_text: Callable[[TimedStream], Awaitable[None]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TimedStream:
    """Read `chunks` (from `SwarmClient.chat` or `.complete`) to the end, stamping each chunk
    that carries text; `on_text` runs after each (a benchmark kills a hop after the n-th).
    `into` is filled as the chunks arrive, so a test can watch a stream in flight."""
    stream = into if into is not None else TimedStream()
    stream.started = clock()
    async for chunk in chunks:
        choices = chunk.get("choices", [])
        piece = "".join(_text_of(choice) for choice in choices)
        if piece:
            stream.text.append(piece)
            stream.stamps.append(clock())
        stream.usage = chunk.get("usage") or stream.usage
        if "swarm" in chunk:
            stream.trace = from_json(RequestTrace, chunk["swarm"])
        if piece and on_text is not None:
            await on_text(stream)
    return stream


def _text_of(choice: dict[str, Any]) -> str:
    if "delta" in choice:  # a chat completion's chunk
        return str(choice["delta"].get("content") or "")
    return str(choice.get("text") or "")  # a plain completion's
