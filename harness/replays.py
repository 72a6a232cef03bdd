"""Concurrent greedy streams that a fault interrupts: the prompts, each stream's text, its
re-routes and how long it stalled after the fault, and the check against what one process
generates (tests/test_failover_e2e.py, tests/test_replay_e2e.py, bench.failover --streams)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from harness.polling import until
from harness.reference import Generated, generate_locally
from harness.streams import TimedStream, follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.schema import FailoverReport

KILL_AFTER = 2  # tokens every concurrent stream has streamed before the kill
# A long shared preamble makes prefill take long enough to kill a hop in the middle of it.
PREAMBLE = "You are a patient teacher who explains things simply and carefully. " * 24
TOPICS = ["dragons", "bread", "rivers", "clocks", "bees", "volcanoes", "trains", "moons"]
PROMPTS = [f"{PREAMBLE}\nWrite a short story about {topic}." for topic in TOPICS]
# without the preamble: a replay after a fault is short, so rounds of faults stay quick
SHORT_PROMPTS = [f"Write a short story about {topic}." for topic in TOPICS]
# long enough that a fault's replay leaves many tokens to go: a cache rebuilt with other bits
# than the route had sends greedy text elsewhere a few tokens after the fault
TOKENS = 48
STREAMS = len(PROMPTS)


def reference_answers(runtime: RuntimeConfig, prompts: list[str] = PROMPTS) -> list[Generated]:
    # one torch thread, as the nodes have: two would crawl when the machine is contended
    one_thread = dataclasses.replace(runtime, threads=1)
    return asyncio.run(generate_locally(one_thread, prompts, TOKENS))


@dataclass
class Replayed:
    """One of the concurrent streams: what it carried, and its longest wait after the kill."""

    prompt: str
    stream: TimedStream = field(default_factory=TimedStream)
    stall_ms: float = 0.0

    @property
    def text(self) -> str:
        return self.stream.answer

    @property
    def failovers(self) -> tuple[FailoverReport, ...]:
        return () if self.stream.trace is None else self.stream.trace.failovers

    async def run(self, client: SwarmClient, tokens: int) -> None:
        body = {"messages": [{"role": "user", "content": self.prompt}], "max_tokens": tokens}
        await follow(client.chat({**body, "temperature": 0}), into=self.stream)


async def concurrent_replays(
    entry: str,
    prompts: Sequence[str],
    tokens: int,
    start_spare: Callable[[], Awaitable[None]],
    kill_hop: Callable[[], None],
) -> list[Replayed]:
    """Streams `prompts` through `entry`; once every one has its route, `start_spare` (returns
    when the spare serves); once every one decodes, `kill_hop`. Each stream's stall after."""
    client = SwarmClient(entry)
    streams = [Replayed(p) for p in prompts]
    running = [asyncio.create_task(s.run(client, tokens)) for s in streams]
    try:

        async def routed() -> bool:
            return len((await client.status()).sessions) == len(streams)

        await until(routed, "every stream's route", 120, every_s=0.05)
        await start_spare()

        async def decoding() -> bool:
            if any(t.done() for t in running):
                raise RuntimeError("a stream ended before the kill: ask for more tokens")
            return all(s.stream.tokens >= KILL_AFTER for s in streams)

        await until(decoding, "every stream decoding", 300, every_s=0.05)
        killed = time.perf_counter()
        kill_hop()
        await asyncio.gather(*running)
    finally:
        for task in running:
            task.cancel()
    for s in streams:
        # the longest wait for a token after the kill: a step already on its way back when
        # the hop died still arrives, and the stall is at the step after it
        s.stall_ms = s.stream.longest_wait_ms(killed, none=float("nan"))
    return streams


def check(streams: Sequence[Replayed], references: Sequence[Generated]) -> None:
    """Each stream's text is what one process generates for its prompt."""
    for stream, reference in zip(streams, references, strict=True):
        assert stream.text == reference.text, stream.prompt
