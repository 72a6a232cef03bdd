"""Swarm decode speed on loopback against one process running the same runtime.

For 1, 2 and 3 node processes (memory limits force a split into that many hops), and for one
process with the whole model, all with one torch thread each: greedy decode tokens/s of one
stream as the client sees it, the ratio to one process, and the overhead each hop adds
((swarm ms per token - one-process ms per token) / hops). The client asks the node that
serves the first layers, which then runs the head too: a token's step leaves it and comes
back once, a frame per node (an entry serving middle layers would see it twice, a frame
more).

The one process stays loaded in the bench's own process, and its runs alternate with the
swarm's, --repeats of each per swarm: this VM's speed drifts by a fifth from minute to
minute, and a reference taken once at the start moved the ratios by as much. Each row's
ratio is the median of the ratios of its alternated pairs; the one-process column is the
median of that row's own one-process runs.

With --timeline, each swarm's row is followed by where a token's time went (milliseconds per
decode step, summed over its runs from the traces the answers carry): at each hop, decoding
the frame, handing it to the hop server, waiting for the compute thread, computing, the loop
resuming after it and sending the frame on; at the entry, sending, resuming on the result
(from the head's sampling on the compute thread: where the entry serves the first layers,
after its next step has run them) and the head; and what is left of the step for the hops'
sends and the frames in transit (sockets, the kernel, wake-ups).

With --links fast,websocket (the default) the 2- and 3-node rows are run twice: decode steps
passed compute thread to compute thread over fast links, and through each node's event loop
over websockets (`net.fast_links = false`). `stepwise` is fast links with each decoder layer's
decode step run as a call per norm, product and attention (`runtime.dense_layers = false`)
instead of one call per layer (the same bits; the one process keeps its one call).
`pyframes` is fast links with every frame sealed and opened by the Python path
(`net.native_frames = false`), where the C calls for decode steps' frames are built.

    python -m bench.swarm [--tokens 48] [--repeats 3] [--timeline] [--links fast,websocket]
        [--nodes 1,2,3]
    (as a module:
    bench/swarm.py as a script would shadow the swarm package)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from harness.loopback import split_swarm
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import LocalSwarm, load_local
from swarm.sampling_settings import SamplingSettings
from swarm.schema import RequestTrace, RouteHop, Timeline

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def _rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class OneProcess:
    """The whole model in this process, loaded once."""

    def __init__(self, local: LocalSwarm) -> None:
        self._local = local
        self._ids = local.entry.encode_chat([{"role": "user", "content": PROMPT}])

    async def rate(self, tokens: int) -> float:
        local, stamps = self._local, []
        async for event in generate(
            local.entry,
            local.pipeline,
            local.compute,
            self._ids,
            SamplingSettings(max_tokens=tokens),
        ):
            if isinstance(event, Chunk) and event.token_id is not None:
                stamps.append(time.perf_counter())
        return _rate(stamps)


async def swarm_rate(client: SwarmClient, tokens: int) -> tuple[float, RequestTrace | None]:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    stream = await follow(client.chat(body))
    return stream.tokens_per_s(), stream.trace


@dataclass(frozen=True)
class Row:
    swarm: float  # tok/s, median
    one_process: float  # tok/s, median of the runs alternated with the swarm's
    ratio: float  # median of the alternated pairs' ratios
    route: tuple[RouteHop, ...]
    timelines: list[Timeline]  # one per swarm run


# how the nodes pass steps to each other: compute thread to compute thread over fast links,
# or through each node's event loop over its websocket links; fast links with each layer's
# decode step as a call per norm, product and attention instead of one call per layer; and
# fast links with every frame sealed and opened in Python (no C calls for decode steps)
LINKS = {
    "fast": "",
    "websocket": "[net]\nfast_links = false\n",
    "stepwise": "[runtime]\ndense_layers = false\n",
    "pyframes": "[net]\nnative_frames = false\n",
}


async def swarm_of(
    n: int, runtime: RuntimeConfig, one: OneProcess, tokens: int, repeats: int, links: str
) -> Row:
    async with split_swarm(runtime, n, LINKS[links], entry_holds_layer_zero=True) as client:
        await swarm_rate(client, tokens)  # warms the swarm up
        pairs: list[tuple[float, float]] = []
        traces: list[RequestTrace] = []
        for _ in range(repeats):
            alone = await one.rate(tokens)
            rate, trace = await swarm_rate(client, tokens)
            pairs.append((alone, rate))
            traces += [trace] if trace is not None else []
        return Row(
            swarm=statistics.median(r for _, r in pairs),
            one_process=statistics.median(a for a, _ in pairs),
            ratio=statistics.median(r / a for a, r in pairs),
            route=traces[-1].route if traces else (),
            timelines=[t.timeline for t in traces if t.timeline is not None],
        )


def print_timeline(timelines: list[Timeline]) -> None:
    """Milliseconds per decode step, summed over the runs: each hop's parts, then the entry's,
    then what none of them accounts for."""
    steps = sum(t.steps for t in timelines)
    if not steps:
        print("    (no timeline in the traces)")
        return
    parts = ("wire_in", "dispatch", "queue", "compute", "resume", "send")
    print(f"    {'ms per token':14}" + "".join(f"{p:>10}" for p in parts))
    hops: dict[str, list[float]] = {}
    for timeline in timelines:
        for hop in timeline.hops:
            sums = hops.setdefault(hop.node, [0.0] * len(parts))
            for i, part in enumerate(parts):
                sums[i] += getattr(hop, part)
    for node, sums in hops.items():
        print(f"    {'hop ' + node[:8]:14}" + "".join(f"{v / steps:10.3f}" for v in sums))
    step = sum(t.step for t in timelines) / steps
    send = sum(t.send for t in timelines) / steps
    resume = sum(t.resume for t in timelines) / steps
    head = sum(t.head for t in timelines) / steps
    # a hop's send goes on while the next hop already decodes: it overlaps transit, so it is
    # shown, not subtracted
    accounted = send + resume + sum(sum(v[:-1]) for v in hops.values()) / steps
    print(f"    entry: step {step:.3f}, send {send:.3f}, resume {resume:.3f}, head {head:.3f}")
    print(f"    sends and transit (step - hops' other parts - entry's): {step - accounted:.3f}")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--timeline", action="store_true", help="where a token's time goes")
    parser.add_argument("--nodes", default="1,2,3", help="comma-separated swarm sizes (1-3)")
    parser.add_argument(
        "--links",
        default="fast,websocket",
        help="comma-separated: fast, websocket, stepwise, pyframes (a row each)",
    )
    args = parser.parse_args()
    runtime = RuntimeConfig(threads=1)
    if args.cache_dir:
        runtime = RuntimeConfig(threads=1, cache_dir=Path(args.cache_dir))
    local = await load_local(runtime)
    try:
        one = OneProcess(local)
        await one.rate(args.tokens)  # warms it up
        print(f"greedy decode, {args.tokens} tokens, one torch thread per process, ", end="")
        print(f"median of {args.repeats}, each swarm run alternated with one of one process")
        print(
            f"{'setup':12}{'tok/s':>8}{'ms/token':>10}{'1 process':>11}{'vs 1 process':>14}", end=""
        )
        print(f"{'overhead/hop ms':>17}  route")
        kinds = [k for k in args.links.split(",") if k]
        if unknown := set(kinds) - set(LINKS):
            parser.error(f"--links takes {', '.join(LINKS)}, not {', '.join(sorted(unknown))}")
        sizes = [int(n) for n in args.nodes.split(",") if n]
        if not set(sizes) <= {1, 2, 3}:
            parser.error(f"--nodes takes 1, 2 and 3, not {args.nodes}")
        setups = [(1, kinds[0])] if 1 in sizes else []
        setups += [(n, kind) for n in (2, 3) if n in sizes for kind in kinds]
        for n, kind in setups:
            row = await swarm_of(n, runtime, one, args.tokens, args.repeats, kind)
            overhead = (1000 / row.swarm - 1000 / row.one_process) / n
            spans = " -> ".join(f"{h.layers[0]}:{h.layers[1]}" for h in row.route)
            label = f"{n} node(s)" if n == 1 else f"{n}, {kind}"
            print(f"{label:12}{row.swarm:8.1f}{1000 / row.swarm:10.1f}", end="")
            print(f"{row.one_process:11.1f}{row.ratio:14.2f}{overhead:17.2f}  {spans}")
            if args.timeline:
                print_timeline(row.timelines)
    finally:
        local.compute.close()


if __name__ == "__main__":
    asyncio.run(main())
