"""More greedy clients than a swarm admits, for `bench.overload` and its short test: each
client asks its entry node again and again until the load stops, waits a refusal's
Retry-After before asking again, and has every admitted answer checked against one process's
text. The tally says what each ask got."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.streams import TimedStream, follow
from swarm.client import SwarmClient
from swarm.errors import RefusedError, SwarmError

PROMPTS = [
    "Describe the city of Paris for a first-time visitor.",
    "Write a short poem about the sea.",
    "Explain how a rainbow forms.",
    "Give three tips for keeping houseplants alive.",
]
NO_RETRY_AFTER_S = 1.0  # what a client waits after a refusal that names no delay


@dataclass
class Tally:
    """What the clients' asks got, all clients together."""

    admitted: int = 0  # answered with a stream that ran to its end
    too_many: int = 0  # 429 at the entry
    unavailable: int = 0  # 503
    cut: int = 0  # in flight when the load stopped (the client went away)
    no_retry_after: list[str] = field(default_factory=list)  # refusals without Retry-After
    unnamed: list[str] = field(default_factory=list)  # 503s whose message names no cause
    failed: list[str] = field(default_factory=list)  # anything else: must stay empty
    wrong: list[str] = field(default_factory=list)  # admitted answers with other text
    latency_s: list[float] = field(default_factory=list)  # admitted: request out to [DONE]
    first_token_s: list[float] = field(default_factory=list)  # admitted: out to first text
    retry_after_s: Counter[float] = field(default_factory=Counter)  # the delays refusals asked
    causes: Counter[str] = field(default_factory=Counter)  # 503 messages, their start
    why_429: Counter[str] = field(default_factory=Counter)  # why the entry refused, its start

    def percentiles(self) -> dict[str, float]:
        """Admitted requests' latency and time to first token: p50, p95, max (seconds)."""
        out = {}
        for name, values in (("latency", self.latency_s), ("first_token", self.first_token_s)):
            for q in (50, 95):
                out[f"{name}_p{q}_s"] = round(percentile(values, q), 2) if values else 0.0
            out[f"{name}_max_s"] = round(max(values, default=0.0), 2)
        return out


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile of `values` (not empty)."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    """A greedy chat request for `prompt`."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


async def ask_once(address: str, prompt: str, max_tokens: int, timeout_s: float) -> TimedStream:
    """One greedy streamed answer through `address`; its pieces timed."""
    client = SwarmClient(address, timeout_s=timeout_s)
    return await follow(client.chat(body(prompt, max_tokens)))


async def client_loop(
    address: str,
    first: int,
    references: dict[str, str],
    max_tokens: int,
    until: float,
    tally: Tally,
    timeout_s: float,
) -> None:
    """Ask `address` for the prompts in turn (from the `first`-th) until time.monotonic()
    passes `until`; an answer still streaming then is cut (counted, never checked)."""
    turn = first
    while (left := until - time.monotonic()) > 0:
        prompt = list(references)[turn % len(references)]
        turn += 1
        try:
            async with asyncio.timeout(left):
                stream = await ask_once(address, prompt, max_tokens, timeout_s)
        except TimeoutError:
            if time.monotonic() >= until:
                tally.cut += 1
                return
            tally.failed.append(f"{address}: no answer within {timeout_s:g} s")
            continue
        except RefusedError as e:
            await _refused(e, address, tally, until)
            continue
        except (SwarmError, OSError) as e:
            tally.failed.append(f"{address}: {e}")
            continue
        tally.admitted += 1
        tally.latency_s.append(time.perf_counter() - stream.started)
        if stream.stamps:
            tally.first_token_s.append(stream.stamps[0] - stream.started)
        if stream.answer != references[prompt]:
            tally.wrong.append(f"{prompt[:30]!r} got {stream.answer!r}")


async def _refused(error: RefusedError, address: str, tally: Tally, until: float) -> None:
    """Count a refusal, then wait what it asked (no longer than the load lasts)."""
    if error.status == 429:
        tally.too_many += 1
        tally.why_429[str(error).partition("(api.max_concurrent_requests) and ")[2][:24]] += 1
    elif error.status == 503:
        tally.unavailable += 1
        message = str(error).partition(": ")[2]
        tally.causes[message[:90]] += 1
        if not message.strip():
            tally.unnamed.append(f"{address}: {error}")
    else:
        tally.failed.append(f"{address}: {error}")
        return
    if error.retry_after_s is None:
        tally.no_retry_after.append(f"{address}: {error}")
    wait = NO_RETRY_AFTER_S if error.retry_after_s is None else error.retry_after_s
    tally.retry_after_s[wait] += 1
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, until - time.monotonic())):
            await asyncio.sleep(wait)


async def drive(
    entries: Sequence[str],
    clients: int,
    references: dict[str, str],
    max_tokens: int,
    seconds: float,
    timeout_s: float,
) -> Tally:
    """`clients` client loops spread over `entries` in turn, for `seconds`."""
    tally = Tally()
    until = time.monotonic() + seconds
    async with asyncio.TaskGroup() as group:
        for i in range(clients):
            address = entries[i % len(entries)]
            group.create_task(
                client_loop(address, i, references, max_tokens, until, tally, timeout_s)
            )
    return tally
