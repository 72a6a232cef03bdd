"""Several sessions' prefill chunks in one product or one at a time: `Shard.prefill_batch` on
the embedded model (packed, swarm's kernels), 15 layers, one torch thread. Eight sessions'
chunks of each size, as eight calls of one session and as one call of eight; rounds
alternate, so a busy spell of the machine falls on both. What `_SHARED_ROWS` in
`swarm/runtime/families/llama.py` is set from.

    python -m bench.prefill_rows [--chunks 32,128] [--rounds 3] [--shared-rows 256]

`--shared-rows`: the cap to measure with (`--shared-rows 1024` lets all eight 128-token chunks
share their products).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families import llama
from swarm.types import LayerSpan, SessionId

SESSIONS = 8
SPAN = LayerSpan(0, 15)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", default="32,128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shared-rows", type=int, default=llama._SHARED_ROWS)
    args = parser.parse_args()
    llama._SHARED_ROWS = args.shared_rows
    torch.set_num_threads(1)
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, SPAN, runtime)
    names = (f"s{i}" for i in itertools.count())
    print(
        f"{SESSIONS} sessions' chunks, layers {SPAN}, one thread, up to {args.shared_rows} rows "
        "sharing a product; seconds, median of rounds"
    )
    print(f"{'chunk tok':>9}{'alone s':>9}{'shared s':>10}{'shared/alone':>14}")
    for size in (int(c) for c in args.chunks.split(",")):
        hidden = entry.embed(list(range(100, 100 + size)))
        times: dict[int, list[float]] = {1: [], SESSIONS: []}
        for _ in range(args.rounds):
            for per_call in times:
                started = time.perf_counter()
                for _ in range(SESSIONS // per_call):
                    steps = [(SessionId(next(names)), hidden, 0) for _ in range(per_call)]
                    shard.prefill_batch(steps, SPAN)
                times[per_call].append(time.perf_counter() - started)
            for session in list(shard.kv.sessions()):
                shard.close_session(session)
        alone, shared = (statistics.median(times[k]) for k in (1, SESSIONS))
        print(f"{size:>9}{alone:9.2f}{shared:10.2f}{shared / alone:14.2f}")


if __name__ == "__main__":
    main()
