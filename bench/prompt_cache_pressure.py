"""The prompt cache under memory pressure: 3 node processes on loopback (memory for 11 of the
embedded model's 30 layers each, one torch thread each), a KV budget per node of
--positions positions of its layers, and --conversations conversations at once, each with
its own system prompt, all sending turn k together, each request the whole conversation so
far (greedy). The budget holds every live session and the kept blocks of about half the
conversations, so blocks are evicted as sessions grow and some turns start cold.

Per turn: requests that failed (none should), prompt tokens and how many came from the
cache; at the end, each node's kept blocks and their bytes, the blocks adopted, asked for
and missing, kept and evicted, its KV cache in use against its budget, and its resident
memory.

    python -m bench.prompt_cache_pressure [--conversations 8] [--turns 4] [--positions 6144]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime

from bench.prompt_cache import CHAT_SYSTEM, CHAT_TURNS, Answer, Message, ask
from harness.loopback import split_swarm
from harness.paths import MODEL_CACHE
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.inference.entry_side import kv_bytes_per_token_layer
from swarm.runtime.execution.model import ModelContext

LAYERS = 11  # split_swarm gives each of three nodes memory for this many layers


async def converse(
    client: SwarmClient,
    system: str,
    turns: list[str],
    max_tokens: int,
    barrier: list[asyncio.Barrier],
) -> list[Answer | BaseException]:
    """One conversation, turn k sent when every conversation reached turn k."""
    messages: list[Message] = [{"role": "system", "content": system}]
    answers: list[Answer | BaseException] = []
    for k, turn in enumerate(turns):
        await barrier[k].wait()
        messages.append({"role": "user", "content": turn})
        try:
            answer = await ask(client, messages, max_tokens, True)
        except Exception as e:  # a failed request is what this measures: count it, go on
            answers.append(e)
            messages.append({"role": "assistant", "content": ""})
            continue
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer.text})
    return answers


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--positions", type=int, default=6144)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if not 1 <= args.turns <= len(CHAT_TURNS):
        parser.error(f"--turns takes 1 to {len(CHAT_TURNS)}")
    runtime = RuntimeConfig(cache_dir=MODEL_CACHE, threads=1)
    context = ModelContext.open(runtime, progress=False)
    budget = args.positions * LAYERS * kv_bytes_per_token_layer(context)
    config = f"[runtime]\nkv_cache_bytes = {budget}\n"
    turns = CHAT_TURNS[: args.turns]
    async with split_swarm(runtime, 3, config) as client:
        print(
            f"3 node processes, KV budget {budget / 2**20:.0f} MiB each ({args.positions} "
            f"positions of {LAYERS} layers); {args.conversations} conversations at once"
        )
        barrier = [asyncio.Barrier(args.conversations) for _ in turns]
        day = datetime.date(2025, 6, 1)
        systems = [
            CHAT_SYSTEM.format(date=f"{day + datetime.timedelta(days=i):%A %d %B %Y}")
            for i in range(args.conversations)
        ]
        results = await asyncio.gather(
            *(converse(client, s, turns, args.max_tokens, barrier) for s in systems)
        )
        print("turn  failed  prompt tokens  cached  share")
        for k in range(len(turns)):
            answers = [r[k] for r in results]
            ok = [a for a in answers if isinstance(a, Answer)]
            prompt = sum(a.prompt_tokens for a in ok)
            cached = sum(a.cached_tokens for a in ok)
            share = cached / prompt if prompt else 0.0
            print(
                f"{k + 1:>4}  {len(answers) - len(ok):>6}  {prompt:>13}  {cached:>6}  {share:>5.0%}"
            )
        for a in (a for r in results for a in r if not isinstance(a, Answer)):
            print(f"FAILED: {a!r}")
        status = await client.status()
        print(
            "node        blocks  MiB  adopted  missing  kept  evicted  KV used/budget MiB  RSS MiB"
        )
        for member in status.members:
            node = await SwarmClient(member.address).status()
            load = node.node.load
            kept, hop = load.prompt_cache, load.hop
            print(
                f"{member.id[:10]}  {kept.blocks:>6}  {kept.nbytes / 2**20:>3.0f}  "
                f"{kept.adopted:>7}  {kept.missing:>7}  {kept.kept:>4}  "
                f"{kept.evicted:>7}  {hop.kv_used_bytes / 2**20:>6.0f} / "
                f"{hop.kv_budget_bytes / 2**20:<6.0f}     {load.rss_bytes / 2**20:>5.0f}"
            )


if __name__ == "__main__":
    asyncio.run(main())
