"""What the attacker tests share: a swarm of the tiny model behind a secret and an API token,
with low caps and short timeouts (node 0 serves; node 1 starts while the attacks run); raw
sockets from other loopback addresses (every 127.0.0.0/8 address reaches a node bound to
127.0.0.1, and the caps count per address); and readings of a node process's memory and open
descriptors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from harness.cluster import Cluster, start_cluster
from swarm.config import RuntimeConfig
from swarm.demo import free_ports
from swarm.identity import node_id
from swarm.types import NodeId
from swarm.wire import SwarmKeys, generate_secret_file, load_secret

TOKEN = "attacker-test-token-51c0"
NOFILE = 384  # node 0's open-file limit (hard and soft): below what its caps need
CAPS = {
    "max_connections": 200,
    "max_connections_per_address": 48,
    "header_timeout_s": 1.0,
    "idle_timeout_s": 2.0,
    "unauthenticated_body_timeout_s": 1.0,
    "max_unauthenticated": 8,
}
RSS_GROWTH_BOUND = 96 * 1024 * 1024  # bytes a node may grow by over all the attacks


def write_config(folder: Path, secret: Path, caps: Mapping[str, float] = CAPS) -> Path:
    """A node's config file, its `[net]` holding `caps`."""
    token = folder / "api.token"
    token.write_text(TOKEN + "\n")
    net = "".join(f"{name} = {value}\n" for name, value in caps.items())
    config = folder / "bootstrap.toml"
    config.write_text(
        f'[node]\nsecret_file = "{secret}"\n[api]\ntoken_file = "{token}"\n'
        f"max_body_bytes = 65536\n[net]\n{net}"
    )
    return config


def lower_nofile(index: int, pid: int) -> None:
    if index == 0:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def tiny_swarm(tiny_model: Path, folder: Path) -> tuple[RuntimeConfig, Path]:
    """The tiny model's runtime with its cache in `folder`, and a new secret file there."""
    runtime = RuntimeConfig(model=str(tiny_model), cache_dir=folder / "cache", threads=1)
    return runtime, generate_secret_file(folder / "swarm.key")


async def start_tiny(tiny_model: Path, folder: Path) -> tuple[Cluster, RuntimeConfig, Path]:
    """`start` for the tiny model, all in `folder`: the cluster, its runtime and secret."""
    runtime, secret = tiny_swarm(tiny_model, folder)
    return await start(runtime, folder, secret), runtime, secret


async def start(runtime: RuntimeConfig, folder: Path, secret: Path) -> Cluster:
    """Node 0, serving every layer; node 1 is only named (`add_node`), to be started later."""
    config = write_config(folder, secret)
    flags = [["--threads", "1", "--config", str(config)]]
    return await start_cluster(
        runtime, folder / "state", flags, expect_serving=1, token=TOKEN, started=lower_nofile
    )


async def start_split(
    runtime: RuntimeConfig, folder: Path, secret: Path, caps: Mapping[str, float], layers: int
) -> Cluster:
    """Two nodes, each serving half of the model's `layers`, so that a completion needs both
    and the gossip between them; `caps`: their `[net]` settings."""
    config = write_config(folder, secret, caps)
    half = layers // 2
    flags = [
        ["--threads", "1", "--config", str(config), "--span", span]
        for span in (f"0:{half}", f"{half}:{layers}")
    ]
    return await start_cluster(runtime, folder / "state", flags, expect_serving=2, token=TOKEN)


def add_node(cluster: Cluster) -> NodeId:
    """Name one more node, with node 0's flags, and give it its id on disk (as a node that
    ran before would have), without starting it: `cluster.start(i)` does that."""
    (port,) = free_ports(1)
    cluster.addresses.append(f"127.0.0.1:{port}")
    cluster.flags.append(cluster.flags[0])
    return node_id(cluster.state_dir, port)


def keys(secret: Path) -> SwarmKeys:
    raw = load_secret(secret)
    assert raw is not None
    return SwarmKeys.derive(raw)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


async def complete(address: str, prompt: str = "w5 w6 w7", max_tokens: int = 8) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{address}/v1/completions", json=body, headers=auth()) as reply,
    ):
        assert reply.status == 200, await reply.text()
        answer: dict[str, Any] = await reply.json()
    return str(answer["choices"][0]["text"])


async def status(address: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{address}/status", headers=auth()) as reply,
    ):
        got: dict[str, Any] = await reply.json()
    return got


def open_sockets(address: str, source: str, count: int) -> list[socket.socket]:
    """Up to `count` TCP connections from `source` that send nothing (connects that fail,
    once the node's caps or backlog refuse, are skipped)."""
    host, _, port = address.rpartition(":")
    out = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(2.0)
        try:
            s.bind((source, 0))
            s.connect((host, int(port)))
            out.append(s)
        except OSError:
            s.close()
    return out


async def trickle(
    address: str, source: str, path: str = "/gossip", every_s: float = 0.2
) -> tuple[bytes, float]:
    """One POST from `source` whose body trickles in a byte every `every_s` (never all of
    it): the first line of its answer (b"" when the node closed it) and the seconds it took."""
    host, _, port = address.rpartition(":")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n"
    try:
        writer.write(head.encode())
        while True:
            writer.write(b"S")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    return await reader.readline(), time.monotonic() - started
    except ConnectionError:
        return b"", time.monotonic() - started
    finally:
        writer.close()


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the node closed this connection (reads EOF or a reset, without blocking)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.close()


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
