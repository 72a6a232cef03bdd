"""Speculative decoding on loopback: the same swarm of 3 node processes (memory limits force a
split into 3 hops) answers each prompt with drafting on and off (the request's `speculate`),
the two runs of a prompt back to back, the order alternating, so both sides see the same
machine. Greedy, so both answers must be the same text (checked).

Two prompt sets: repetitive ones, whose answers repeat runs of the prompt (edit this code,
fix this JSON, summarize quoting the text), where n-gram drafts are accepted; and open-ended
ones, where few are, and drafting must cost next to nothing. Per set: decode tokens/s each
way (tokens after the first over the time from the first to the last, summed over the set's
runs) and their ratio; the median of the ratios of each prompt's back-to-back pair (this
machine's speed swings by several times from minute to minute under others' load, and one
slow minute weighs on the sums); what the node counted (drafted, accepted, accepted per
verify step); the decode tokens each side counted (answers end where the model stops, most
before --tokens), and the bound free verify steps would give: those tokens over the steps
they took with the accepted drafts (tokens / (tokens - accepted)).

With `--draft-model M` the entry also holds a draft model, which drafts where lookups find
nothing (the open-ended set's case): `--model` and `--dtype` pick the target, e.g. the
embedded model in float32 drafted for by its own packed file (a quantized copy of the
target), or a bigger same-vocabulary model such as harness.gguf_fixture's LLAMA_1B
(`--model fixture-1b`, random weights: the embedded model's drafts are never its argmax, so
what it shows is the back-off). The node's counts of the draft model's tokens are printed
per set.

    python -m bench.speculative [--tokens 96] [--repeats 2] [--sets repetitive,open-ended]
        [--model M] [--dtype D] [--draft-model M]   (as a module: bench/swarm.py as a script
    would shadow the swarm package)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from bench.runtime import FIXTURE_1B
from harness.gguf_fixture import LLAMA_1B, fixture_path
from harness.loopback import split_swarm
from harness.paths import FIXTURES
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig

REPETITIVE = [
    "Rewrite this Python code to use `pathlib` instead of `os.path`, and reply with the code "
    "only:\n```python\nimport os\n\ndef config_path(home):\n"
    "    folder = os.path.join(home, '.config', 'swarm')\n"
    "    if not os.path.exists(folder):\n        os.makedirs(folder)\n"
    "    return os.path.join(folder, 'bootstrap.toml')\n```",
    'Add the field "id": 7 to this JSON object and reply with the whole object only:\n'
    '{"name": "desk lamp", "price": 12.5, "tags": ["desk", "light", "led"], "stock": '
    '{"shop": 4, "web": 11}, "colors": ["black", "white", "silver"]}',
    "Fix this JSON so that it parses and reply with the corrected JSON only:\n"
    '{"city": "Lyon", "population": 522000 "rivers": ["Rhone", "Saone"], "mayor": {"name": '
    '"Gregory Doucet", "since": 2020}, "twins": ["Birmingham", "Frankfurt" "Milan"]}',
    "Quote the first two sentences of this text word for word, then summarize it in one "
    "sentence: 'The lighthouse stood on the northern cliff for two hundred years. Every night "
    "its keeper climbed the ninety steps to light the lamp. Ships passing the cape relied on "
    "its beam to avoid the rocks below.'",
    "Correct the spelling in this text and reply with the corrected text only: 'The quick "
    "brown fox jumpd over the lazy dog. The dog was not amused, and it barkd at the fox "
    "untill the fox ran away into the forrest.'",
]
OPEN_ENDED = [
    "Write a short story about a dragon who is afraid of the dark.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three tips for someone learning to cook.",
]


@dataclass
class Side:
    tokens: int = 0  # decode tokens (after the first) over every run
    seconds: float = 0.0  # from the first token to the last, over every run

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


async def answer(
    client: SwarmClient, prompt: str, tokens: int, speculate: bool
) -> tuple[str, int, float]:
    """The text, its decode tokens after the first, and the seconds they took."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "speculate": speculate,
        "stream_options": {"include_usage": True},
    }
    parts: list[str] = []
    first = last = 0.0
    completion = 0
    async for chunk in client.chat(body):
        now = time.perf_counter()
        for choice in chunk.get("choices", []):
            text = choice.get("delta", {}).get("content")
            if text:
                parts.append(text)
                first = first or now
                last = now
        usage = chunk.get("usage")
        if usage:
            completion = int(usage["completion_tokens"])
    return "".join(parts), max(0, completion - 1), last - first


async def run_set(
    client: SwarmClient, prompts: list[str], tokens: int, repeats: int
) -> tuple[Side, Side, list[float]]:
    """Both sides summed, and each prompt's ratio per round (its two runs back to back)."""
    on, off = Side(), Side()
    ratios: list[float] = []
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            order = (True, False) if (r + i) % 2 == 0 else (False, True)
            texts, rates = {}, {}
            for speculate in order:
                text, decoded, seconds = await answer(client, prompt, tokens, speculate)
                side = on if speculate else off
                side.tokens += decoded
                side.seconds += seconds
                texts[speculate], rates[speculate] = text, decoded / seconds
            if texts[True] != texts[False]:
                raise SystemExit(f"the text changed with speculation for {prompt[:40]!r}")
            ratios.append(rates[True] / rates[False])
    return on, off, ratios


def free_verify_bound(tokens: int, accepted: int) -> float:
    """What the ratio would be if a verify step cost what a one-position step costs: the
    decode tokens (each answer's after its first, as counted: most answers end before
    --tokens) over the steps they took with drafts accepted."""
    return tokens / (tokens - accepted) if tokens > accepted else float("inf")


async def drafted(client: SwarmClient) -> tuple[int, int, int, int, int]:
    report = (await client.status()).speculation
    return (
        report.drafted,
        report.accepted,
        report.verify_steps,
        report.model_drafted,
        report.model_accepted,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sets", default="repetitive,open-ended")
    parser.add_argument("--model", default=RuntimeConfig().model)
    parser.add_argument("--dtype", default="packed")
    parser.add_argument("--draft-model", default="")
    args = parser.parse_args()
    sets = {"repetitive": REPETITIVE, "open-ended": OPEN_ENDED}
    chosen = [(name, sets[name]) for name in args.sets.split(",")]
    if args.model == FIXTURE_1B:
        args.model = str(fixture_path(LLAMA_1B, FIXTURES))
    runtime = RuntimeConfig(model=args.model, dtype=args.dtype, threads=1)
    entry_flags = ["--draft-model", args.draft_model] if args.draft_model else []
    async with split_swarm(runtime, 3, entry_flags=entry_flags) as client:
        await answer(client, OPEN_ENDED[0], 16, True)  # warms the swarm up
        print(f"3 node processes on loopback, one torch thread each, greedy, {args.tokens}")
        print(f"tokens per answer, {args.repeats} rounds, each prompt both ways in turn;")
        print(f"model {args.model} ({args.dtype}), draft model {args.draft_model or 'none'}")
        print(f"{'prompts':12}{'with tok/s':>12}{'without':>10}{'ratio':>8}", end="")
        print(f"{'median':>8}{'drafted':>10}{'accepted':>10}{'per verify':>12}", end="")
        print(f"{'by model':>10}{'taken':>8}{'tokens':>8}{'bound':>7}")
        for name, prompts in chosen:
            before = await drafted(client)
            on, off, ratios = await run_set(client, prompts, args.tokens, args.repeats)
            after = await drafted(client)
            d, a, v, md, ma = (x - y for x, y in zip(after, before, strict=True))
            print(f"{name:12}{on.rate:12.1f}{off.rate:10.1f}{on.rate / off.rate:8.2f}", end="")
            per_verify = a / v if v else 0.0
            print(f"{statistics.median(ratios):8.2f}{d:10}{a:10}{per_verify:12.2f}", end="")
            print(f"{md:10}{ma:8}{on.tokens:8}{free_verify_bound(on.tokens, a):7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
