"""Concurrent streams on one process, without the network: what the runtime alone gives for 8
greedy streams in lockstep against one, with decode attention on swarm's kernel
(`swarm.runtime.weights.native.decode_attention`, one call per layer for every session) and on
torch's (a cache write and a scaled-dot-product call per session and layer).

Both shards are loaded in one process on one compute thread (native attention off while the
second loads) and the runs alternate between them, so both see the same machine. Each run
prefills one chat prompt per stream, then decodes --tokens tokens: every step is the entry's
head for all streams as one product (`EntryModel.last_logits`), a greedy pick, and one batched
decode step through every layer (`Shard.decode_batch`; one stream: `Shard.forward`). Prints
tokens/s (medians of --repeats), the ratio of the two attentions and 8 streams / 1 stream.

    python -m bench.batched_decode [--streams 1,8] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from swarm.config import RuntimeConfig, load_config
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import native
from swarm.types import LayerSpan, SessionId

TOPICS = ["rivers", "bread", "comets", "violins", "glaciers", "bees", "lighthouses", "chess"]


def load_shard(context: ModelContext, runtime: RuntimeConfig, native_attention: bool) -> Shard:
    """The whole model as one shard, its layers built with or without swarm's attention."""
    span = LayerSpan(0, context.num_layers)
    if native_attention:
        return Shard.load(context, span, runtime)
    with native.switched(dataclasses.replace(native.switches(), native_attention=False)):
        return Shard.load(context, span, runtime)


def decode(
    entry: EntryModel, shard: Shard, streams: int, tokens: int, run: str
) -> tuple[float, list[list[int]]]:
    """Tokens per second of `streams` greedy streams in lockstep, and their tokens."""
    sessions = [SessionId(f"{run}-{i}") for i in range(streams)]
    positions, outputs = [], []
    for i, session in enumerate(sessions):
        prompt = f"Tell me three things about {TOPICS[i % len(TOPICS)]}."
        ids = entry.encode_chat([{"role": "user", "content": prompt}])
        outputs.append(shard.forward(session, entry.embed(ids), 0)[:, -1:])
        positions.append(len(ids))
    generated: list[list[int]] = [[] for _ in sessions]
    started = time.perf_counter()
    for step in range(tokens):
        picks = [int(logits.argmax()) for logits in entry.last_logits(outputs)]
        steps = []
        for i, (session, token) in enumerate(zip(sessions, picks, strict=True)):
            generated[i].append(token)
            steps.append((session, entry.embed([token]), positions[i] + step))
        if streams == 1:
            outputs = [shard.forward(*steps[0])]
        else:
            results = shard.decode_batch(steps, shard.span)
            outputs = [r for r in results if isinstance(r, torch.Tensor)]
    elapsed = time.perf_counter() - started
    for session in sessions:
        shard.kv.close(session)
    return streams * tokens / elapsed, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", default="1,8", help="stream counts, comma-separated")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    torch.set_num_threads(1)
    runtime = load_config(overrides={"runtime": {"threads": 1}}).runtime
    context = ModelContext.open(runtime, progress=False)
    if not native.decode_attention_wanted():
        raise SystemExit("swarm's kernels are not available here: nothing to compare")
    entry = EntryModel(context)
    shards = {
        "swarm": load_shard(context, runtime, True),
        "torch": load_shard(context, runtime, False),
    }
    rates: dict[tuple[str, int], list[float]] = {}
    same = total = 0
    with torch.inference_mode():
        decode(entry, shards["swarm"], 1, 4, "warm")
        for repeat in range(args.repeats):
            for streams in counts:
                texts = {}
                for kind, shard in shards.items():
                    rate, texts[kind] = decode(
                        entry, shard, streams, args.tokens, f"{kind}{repeat}"
                    )
                    rates.setdefault((kind, streams), []).append(rate)
                for a, b in zip(texts["swarm"], texts["torch"], strict=True):
                    same += sum(x == y for x, y in zip(a, b, strict=True))
                    total += len(a)
    print(f"model {runtime.model}, {native.kernel_name()} products, 1 thread, {args.tokens} tokens")
    print(f"{'streams':>8}{'swarm attention':>17}{'torch attention':>17}{'ratio':>8}   tok/s")
    for streams in counts:
        mine = statistics.median(rates[("swarm", streams)])
        theirs = statistics.median(rates[("torch", streams)])
        print(f"{streams:8}{mine:17.1f}{theirs:17.1f}{mine / theirs:7.2f}x")
    if 1 in counts:
        for streams in (c for c in counts if c > 1):
            for kind in shards:
                ratio = statistics.median(rates[(kind, streams)]) / statistics.median(
                    rates[(kind, 1)]
                )
                print(f"{streams} streams / 1 stream, {kind} attention: {ratio:.2f}x")
    print(f"greedy tokens equal between the two attentions: {same}/{total}")


if __name__ == "__main__":
    main()
