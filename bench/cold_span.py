"""What a hop's layers cost when its process sleeps between turns, as a split's hops do: one
process, the embedded model's first --layers layers as one shard, decode steps back to back
against steps after a sleep of --sleep-ms, after a sweep of 64 MiB through the caches (what
another process computing meanwhile does to them), and after both. Medians of --steps, in
rounds alternating the four, so the machine's drift falls on all of them.

    python -m bench.cold_span [--layers 11] [--sleep-ms 12] [--steps 60] [--rounds 2]

No network, no frames, no event loop: what is slower here is the machine waking up (caches,
the core's clock), which a split pays at every hop whatever passes the frames."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, SessionId

_SWEEP_BYTES = 64 * 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=11)
    parser.add_argument("--sleep-ms", type=float, default=12.0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, args.layers), runtime)
    session = SessionId("cold-span")
    shard.forward(session, entry.embed([1, 504, 2364, 314]), 0)
    position = 4
    token = entry.embed([42])
    sweep = torch.empty(_SWEEP_BYTES // 4)

    def median_ms(sleep: bool, swept: bool) -> float:
        nonlocal position
        times = []
        for _ in range(args.steps):
            if sleep:
                time.sleep(args.sleep_ms / 1000)
            if swept:
                sweep.add_(1.0)
            started = time.perf_counter()
            shard.forward(session, token, position)
            times.append((time.perf_counter() - started) * 1000)
            position += 1
        return statistics.median(times)

    cases = {
        "back to back": (False, False),
        f"after {args.sleep_ms:g} ms asleep": (True, False),
        "after a 64 MiB sweep": (False, True),
        "after both": (True, True),
    }
    print(f"{args.layers} layers of the embedded model, one thread, ms per decode step")
    for _ in range(args.rounds):
        row = {name: median_ms(*how) for name, how in cases.items()}
        print("  ".join(f"{name} {ms:.3f}" for name, ms in row.items()))


if __name__ == "__main__":
    main()
