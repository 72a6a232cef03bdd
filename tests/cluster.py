"""Real node processes on loopback for end-to-end tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage


@dataclass
class Cluster:
    addresses: list[str]
    processes: list[Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        stop_nodes(self.processes)


async def start_cluster(
    runtime: RuntimeConfig,
    state_dir: Path,
    node_flags: Sequence[Sequence[str]],
    expect_serving: int,
    timeout_s: float = 240.0,
    token: str | None = None,
) -> Cluster:
    """One node per entry of `node_flags`, the first being everyone's bootstrap; returns once
    every layer is covered by `expect_serving` serving members. `token`: the API token the
    nodes were configured with, if any."""
    ports = free_ports(len(node_flags))
    cluster = Cluster([f"127.0.0.1:{p}" for p in ports])
    try:
        for i, (port, flags) in enumerate(zip(ports, node_flags, strict=True)):
            join = None if i == 0 else cluster.addresses[0]
            cluster.processes.append(start_node(port, join, state_dir, runtime, list(flags)))
        await wait_for_coverage(cluster.addresses[0], expect_serving, timeout_s, token)
    except BaseException:
        cluster.stop()
        raise
    return cluster
