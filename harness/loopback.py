"""A swarm of node processes on loopback, each capped so the model splits into as many
hops as there are nodes (one torch thread each): what bench.swarm and bench.speculative
measure against one process."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import NodeProcess, free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer


def split_flags(runtime: RuntimeConfig, nodes: int) -> list[str]:
    """Each node's flags: layer memory for a little over its share of the model's layers,
    so the model splits into `nodes` hops, and one torch thread."""
    context = ModelContext.open(runtime, progress=False)
    layers = context.num_layers
    per_node = layers if nodes == 1 else -(-layers // nodes) + 1
    return ["--layer-memory-bytes", str(per_node * bytes_per_layer(context)), "--threads", "1"]


@contextlib.asynccontextmanager
async def split_swarm(
    runtime: RuntimeConfig,
    nodes: int,
    config_toml: str = "",
    entry_flags: Sequence[str] = (),
    *,
    entry_holds_layer_zero: bool = False,
) -> AsyncIterator[SwarmClient]:
    """A client of the first of `nodes` node processes, once every layer is served; the
    nodes stop when the block ends. `config_toml`: a bootstrap.toml every node reads;
    `entry_flags`: command-line flags of the first node alone. `entry_holds_layer_zero`: the
    client is of the node that serves the first layers instead, as llama.cpp's RPC host
    holds them: a token's step then leaves the entry and comes back to it once, a frame per
    node. An entry that serves middle layers sees its token's step twice, one frame more
    (the last hop's result back to it, then its next step out to the first hop)."""
    flags = split_flags(runtime, nodes)
    ports = free_ports(nodes)
    processes: list[NodeProcess] = []
    with tempfile.TemporaryDirectory() as state:
        if config_toml:
            (Path(state) / "bootstrap.toml").write_text(config_toml)
            flags += ["--config", str(Path(state) / "bootstrap.toml")]
        try:
            for i, port in enumerate(ports):
                join = None if i == 0 else f"127.0.0.1:{ports[0]}"
                own = [*flags, *entry_flags] if i == 0 else flags
                processes.append(start_node(port, join, Path(state), runtime, own))
            status = await wait_for_coverage(f"127.0.0.1:{ports[0]}", nodes, 240)
            entry = f"127.0.0.1:{ports[0]}"
            if entry_holds_layer_zero:
                entry = next(
                    m.address
                    for m in status.members
                    if m.state == "alive" and m.span and m.span[0] == 0
                )
            yield SwarmClient(entry)
        finally:
            stop_nodes(processes)
