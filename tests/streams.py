"""Concurrent greedy chat streams against a real cluster, for the failover and chaos tests:
the prompts, a client that records each stream's text, token times and trace, and the check
against what one process generates."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.reference import Generated, generate_locally
from swarm.config import RuntimeConfig

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
class Stream:
    prompt: str
    text: list[str] = field(default_factory=list)
    tokens_seen: int = 0
    token_times: list[float] = field(default_factory=list)  # monotonic, one per chunk
    trace: dict[str, Any] | None = None
    error: str | None = None

    def longest_gap_ms(self, after: float) -> float:
        """The longest wait for a token that was still awaited at monotonic time `after`."""
        gaps = [
            (b - max(a, after)) * 1000
            for a, b in zip(self.token_times, self.token_times[1:], strict=False)
            if b > after
        ]
        return max(gaps, default=0.0)


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        return await r.json()


async def run_stream(http: aiohttp.ClientSession, entry: str, stream: Stream) -> None:
    body = {
        "messages": [{"role": "user", "content": stream.prompt}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
    }
    stream.token_times.append(time.monotonic())
    async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            stream.error = f"HTTP {r.status}: {await r.text()}"
            return
        async for line in r.content:
            payload = line.decode().strip()
            if not payload.startswith("data: {"):
                continue
            chunk = json.loads(payload[len("data: ") :])
            if "error" in chunk:
                stream.error = chunk["error"]["message"]
            for choice in chunk.get("choices", []):
                stream.text.append(choice["delta"].get("content", ""))
                stream.tokens_seen += 1
                stream.token_times.append(time.monotonic())
            stream.trace = chunk.get("swarm", stream.trace)


def check(streams: list[Stream], references: list[Generated]) -> None:
    for stream, reference in zip(streams, references, strict=True):
        assert stream.error is None, stream.error
        assert "".join(stream.text) == reference.text
