"""What a verify step of k positions costs against a one-position decode step, in one process:
each row is computed as a one-position decode step would be (Shard.decode_rows, the path a
verify step takes at every hop) through every layer, then the entry's head on every row
(EntryModel.rows_logits), after a 60-token prompt. Speculative decoding pays where a drafted
position costs little against a step: this prints each part's milliseconds per k and what
each position after the first adds.

    python -m bench.verify_rows [--model M] [--threads 1] [--rows 1,2,3,5,9] [--repeats 9]
"""

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

PROMPT_TOKENS = 60


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=RuntimeConfig().model)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,3,5,9", help="positions per step, comma-separated")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    sizes = [int(k) for k in args.rows.split(",")]
    torch.set_num_threads(args.threads)
    runtime = RuntimeConfig(model=args.model, dtype="packed", threads=args.threads)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
    ids = [100 + i for i in range(PROMPT_TOKENS + max(sizes))]
    session = SessionId("verify-rows")
    shard.forward(session, entry.embed(ids[:PROMPT_TOKENS]), 0)
    layers: dict[int, list[float]] = {k: [] for k in sizes}
    head: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(args.repeats):
        for k in sizes:  # every step at the same position: the cache rewinds to it
            hidden = entry.embed(ids[PROMPT_TOKENS : PROMPT_TOKENS + k])
            began = time.perf_counter()
            (out,) = shard.decode_rows([(session, hidden, PROMPT_TOKENS)], shard.span).outputs
            between = time.perf_counter()
            assert isinstance(out, torch.Tensor)
            entry.rows_logits([out])
            ended = time.perf_counter()
            layers[k].append((between - began) * 1000)
            head[k].append((ended - between) * 1000)
    print(
        f"{args.model}, packed, {args.threads} thread(s), {context.num_layers} layers, "
        f"after {PROMPT_TOKENS} tokens; medians of {args.repeats}"
    )
    print(f"{'positions':>9} {'layers ms':>10} {'head ms':>8} {'step ms':>8} {'per added':>10}")
    one = statistics.median(layers[sizes[0]]) + statistics.median(head[sizes[0]])
    for k in sizes:
        lay, hd = statistics.median(layers[k]), statistics.median(head[k])
        added = (lay + hd - one) / (k - sizes[0]) if k > sizes[0] else 0.0
        print(f"{k:>9} {lay:>10.2f} {hd:>8.2f} {lay + hd:>8.2f} {added:>10.2f}")


if __name__ == "__main__":
    main()
