"""The swarm over capped links: three real node processes, each in its own network namespace
(harness/netns.py), the embedded model split three ways.

1. Links at 100 Mbit/s and 1 Gbit/s, hidden states sent raw (float32) or as int8 (per block of
   64 after a Hadamard rotation; lz4 on every frame where it helps): time of a prefill of a
   1024-token prompt (the request with one new token, so it includes one head and sampling),
   and decode tokens/s of a greedy stream.
2. Two replicas of the whole model, one behind a 100 Mbit/s link and one behind 1 Gbit/s, and an
   entry that serves nothing: the round trips the entry measured and the route it chooses.

Needs root and ip, tc, nft (see harness/netns.py). Run from the repository root:

    python -m bench.network [--repeats 3] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.netns import API_TOKEN, AUTH, Lab, unavailable
from harness.paths import MODEL_CACHE
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.errors import SwarmError
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.schema import RequestTrace
from swarm.telemetry import bytes_per_layer
from swarm.wire import generate_secret_file

CODECS = ("raw", "int8_hadamard64")
RATES_MBIT = (100, 1000)
PROMPT_TOKENS = 1024
DECODE_PROMPT = "Tell me a story about a dragon who learns to cook."


def _prompt(context: ModelContext) -> str:
    """A plain-text prompt of exactly PROMPT_TOKENS tokens."""
    entry = EntryModel(context)
    words = PROMPT_TOKENS
    while True:
        text = "The" + " the" * (words - 1)
        n = len(entry.encode_text(text))
        if n == PROMPT_TOKENS:
            return text
        words += PROMPT_TOKENS - n


async def _post(address: str, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The answer and its seconds; while the swarm says 503 (a member suspected or moving
    its span on this loaded machine), ask again for up to a minute."""
    timeout = aiohttp.ClientTimeout(total=600)
    deadline = time.monotonic() + 60
    while True:
        started = time.perf_counter()
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=AUTH) as http,
            http.post(f"http://{address}{path}", json=body) as r,
        ):
            answer: dict[str, Any] = await r.json()
            if r.status == 200:
                return answer, time.perf_counter() - started
            if r.status != 503 or time.monotonic() > deadline:
                raise RuntimeError(f"{address} answered {r.status}: {answer}")
        print(f"  {address}: {answer['error']['message']}; asking again", file=sys.stderr)
        await asyncio.sleep(1)


async def _prefill_s(address: str, prompt: str) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    answer, took = await _post(address, "/v1/completions", body)
    if answer["usage"]["prompt_tokens"] != PROMPT_TOKENS:
        raise RuntimeError(f"prompt of {answer['usage']['prompt_tokens']} tokens")
    return took


async def _decode_tokens_per_s(address: str, tokens: int) -> tuple[float, RequestTrace | None]:
    """Greedy stream; tokens/s between the first and the last token. A stream the loaded
    machine failed (a member suspected mid-way) is asked again, twice at most."""
    for attempt in range(3):
        try:
            return await _stream(address, tokens)
        except (RuntimeError, SwarmError) as e:
            if attempt == 2:
                raise
            print(f"  {e}; asking again", file=sys.stderr)
            await asyncio.sleep(2)
    raise AssertionError("unreachable")


async def _stream(address: str, tokens: int) -> tuple[float, RequestTrace | None]:
    body = {
        "messages": [{"role": "user", "content": DECODE_PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    stream = await follow(SwarmClient(address, token=API_TOKEN).chat(body))
    return stream.tokens_per_s(), stream.trace


async def _round_trips(address: str) -> dict[str, float | None]:
    status = await SwarmClient(address, token=API_TOKEN).status()
    return {m.address: m.rtt_ms for m in status.members}


async def _codec_rows(
    runtime: RuntimeConfig, memory: str, prompt: str, codec: str, args: argparse.Namespace
) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="swarm-bench-net-") as tmp, Lab(3) as lab:
        secret = generate_secret_file(Path(tmp) / "swarm.key")
        env = {"SWARM_NET_ACTIVATION_CODEC": codec}
        flags = ["--layer-memory-bytes", memory, "--threads", "1"]
        first = lab.start_node(0, runtime, Path(tmp), secret, flags, None, env)
        for i in (1, 2):
            lab.start_node(i, runtime, Path(tmp), secret, flags, first, env)
        await wait_for_coverage(first, 3, 600, API_TOKEN)
        await _prefill_s(first, prompt)  # warm-up: caches, links, allocator
        for mbit in RATES_MBIT:
            lab.cap_all(mbit)
            prefill = [await _prefill_s(first, prompt) for _ in range(args.repeats)]
            decode = [
                (await _decode_tokens_per_s(first, args.tokens))[0] for _ in range(args.repeats)
            ]
            rows.append(
                f"| {mbit:>5} Mbit/s | {codec:<15} | {1000 * statistics.median(prefill):9.0f} "
                f"| {statistics.median(decode):8.1f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


async def _route_choice(runtime: RuntimeConfig, args: argparse.Namespace) -> list[str]:
    """Host 0 is an entry with no room for layers; hosts 1 and 2 hold the whole model."""
    with tempfile.TemporaryDirectory(prefix="swarm-bench-net-") as tmp, Lab(3) as lab:
        secret = generate_secret_file(Path(tmp) / "swarm.key")
        lab.cap(1, 100)
        lab.cap(2, 1000)
        full = ["--threads", "1"]
        first = lab.start_node(1, runtime, Path(tmp), secret, full)
        lab.start_node(2, runtime, Path(tmp), secret, full, first)
        entry = lab.start_node(
            0, runtime, Path(tmp), secret, [*full, "--layer-memory-bytes", "1"], first
        )
        await wait_for_coverage(entry, 2, 600, API_TOKEN)
        names = {lab.hosts[1].address: "100 Mbit/s", lab.hosts[2].address: "1 Gbit/s"}
        deadline = time.monotonic() + 60
        while True:  # until the entry has measured both replicas
            rtt = await _round_trips(entry)
            if all(rtt.get(a) is not None for a in names) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        speed, trace = await _decode_tokens_per_s(entry, args.tokens)
        hops = trace.route if trace is not None else ()
        route = " -> ".join(names.get(h.address, h.address) for h in hops)
        lines = [
            f"entry's measured round trip (128 KiB probe) to the replica behind {n}: "
            f"{rtt.get(a)} ms"
            for a, n in names.items()
        ]
        lines.append(f"route chosen: {route} ({speed:.1f} tokens/s)")
        return lines


async def _main(args: argparse.Namespace) -> int:
    reason = unavailable()
    if reason is not None:
        print(f"bench.network cannot run here: {reason}", file=sys.stderr)
        return 1
    runtime = RuntimeConfig(cache_dir=MODEL_CACHE)
    context = ModelContext.open(runtime)
    memory = str(11 * bytes_per_layer(context))  # 30 layers need all three nodes
    prompt = _prompt(context)
    header = [
        f"3 nodes in network namespaces, {context.num_layers} layers split 3 ways, one torch "
        f"thread each; prefill of {PROMPT_TOKENS} tokens, decode of {args.tokens} tokens, "
        f"median of {args.repeats}",
        "",
        "| link          | activations     | prefill ms | decode tok/s |",
        "|---------------|-----------------|-----------:|---------:|",
    ]
    rows: list[str] = []
    for codec in CODECS:
        rows += await _codec_rows(runtime, memory, prompt, codec, args)
    route = await _route_choice(runtime, args)
    print("\n".join([*header, *sorted(rows), "", *route]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
