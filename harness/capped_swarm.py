"""One model served two ways, for the bench and the slow test that compare them: in this
process as one shard, and by real node processes on loopback whose --layer-memory-bytes leave
each room for a bit more than its share of the layers, so none can hold the model and the
swarm splits it. Both decode greedily from the same chat prompt; each returns its text."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.runtime.execution.model import ModelContext
from swarm.sampling_settings import SamplingSettings
from swarm.schema import Timeline
from swarm.telemetry import bytes_per_layer

READY_TIMEOUT_S = 900.0  # each node reads its third of a 3 GB file on a shared disk


@dataclass(frozen=True)
class Decode:
    text: str
    prefill_ms: float  # request to the first token
    tokens_per_s: float  # after the first token
    tokens: int
    timeline: Timeline | None = None  # where a step's time went at each hop (node processes)


@dataclass(frozen=True)
class Node:
    port: int
    span: tuple[int, int] | None
    rss_bytes: int  # resident now
    peak_rss_bytes: int  # the most it was resident


def _rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


async def one_process(
    runtime: RuntimeConfig, prompt: str, tokens: int, runs: int = 1
) -> tuple[list[Decode], int]:
    """The whole model as one shard in this process; `runs` greedy decodes, and the number of
    prompt tokens. The model is freed before returning."""
    local = await load_local(runtime)
    try:
        ids = local.entry.encode_chat([{"role": "user", "content": prompt}])
        params = SamplingSettings(max_tokens=tokens)
        results = []
        for _ in range(runs):
            start, stamps, text = time.perf_counter(), [], []
            async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
                if isinstance(event, Chunk):
                    text.append(event.text)
                    if event.token_id is not None:
                        stamps.append(time.perf_counter())
            prefill = (stamps[0] - start) * 1000
            results.append(Decode("".join(text), prefill, _rate(stamps), len(stamps)))
        return results, len(ids)
    finally:
        local.compute.close()


def _resident(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


async def capped_nodes(
    runtime: RuntimeConfig, prompt: str, tokens: int, nodes: int = 3, runs: int = 1
) -> tuple[list[Decode], list[Node], int]:
    """`nodes` node processes, one torch thread each, each capped to ceil(layers / nodes) + 1
    layers; `runs` greedy decodes through the first's API, each node's span and memory after
    them, and the cap in bytes."""
    context = ModelContext.open(runtime, progress=False)  # converts the file once, up front
    cap = (-(-context.num_layers // nodes) + 1) * bytes_per_layer(context)
    del context
    ports = free_ports(nodes)
    processes = []
    with tempfile.TemporaryDirectory(prefix="capped-swarm-") as state:
        try:
            for i, port in enumerate(ports):
                join = None if i == 0 else f"127.0.0.1:{ports[0]}"
                flags = ["--layer-memory-bytes", str(cap), "--threads", "1"]
                processes.append(start_node(port, join, Path(state), runtime, flags))
            await wait_for_coverage(f"127.0.0.1:{ports[0]}", nodes, READY_TIMEOUT_S)
            client = SwarmClient(f"127.0.0.1:{ports[0]}")
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens,
                "temperature": 0,
            }
            results = []
            for _ in range(runs):
                stream = await follow(client.chat(body))
                prefill = (stream.stamps[0] - stream.started) * 1000
                timeline = None if stream.trace is None else stream.trace.timeline
                results.append(
                    Decode(stream.answer, prefill, _rate(stream.stamps), stream.tokens, timeline)
                )
            status = await client.status()  # the spans after the runs: placement may move them
            spans = {int(m.address.rpartition(":")[2]): m.span for m in status.members}
            found = [
                Node(port, spans.get(port), *_resident(p.pid))
                for port, p in zip(ports, processes, strict=True)
            ]
            return results, found, cap
        finally:
            stop_nodes(processes)
