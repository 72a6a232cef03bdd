"""`swarm demo`: three real node processes on loopback, with memory limits that force a
three-way split; waits until every layer is covered, asks a question through the HTTP API,
prints the answer with its route and per-hop timings, and stops the nodes cleanly."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.errors import LinkError, StatusFormatError, SwarmError
from swarm.runtime.execution.model import ModelContext
from swarm.schema import NodeStatus, RequestTrace
from swarm.telemetry import bytes_per_layer

NODES = 3
# Three nodes share this machine's cores: one torch thread each, or their OpenMP teams spin
# against each other.
_SHARED_MACHINE = ["--threads", "1"]
READY_TIMEOUT_S = 180.0


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_node(
    port: int, join: str | None, state_dir: Path, runtime: RuntimeConfig, extra: list[str]
) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "swarm",
        "node",
        "--preset",
        "local",
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        # `extra` may name the model itself: a second --model would start a node per model
        *([] if "--model" in extra else ["--model", runtime.model]),
        "--cache-dir",
        str(runtime.cache_dir),
        "--dtype",
        runtime.dtype,
        *extra,
    ]
    if join:
        args += ["--join", join]
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / f"node-{port}.log").open("ab") as log:  # the child keeps its own handle
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)


async def wait_for_coverage(
    address: str, members: int, deadline_s: float, token: str | None = None, copies: int = 1
) -> NodeStatus:
    """Until `members` alive members serve a span and every layer has `copies` alive holders,
    as `address` sees."""
    client = SwarmClient(address, token=token)
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            status = await client.status()
            spans = [m.span for m in status.members if m.state == "alive" and m.span]
            if status.coverage.complete and len(spans) >= members and _holders(spans) >= copies:
                return status
        except (LinkError, StatusFormatError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SwarmError(
                f"the swarm did not serve every layer {copies} time(s) within {deadline_s:.0f} s"
            )
        await asyncio.sleep(0.5)


def _holders(spans: list[tuple[int, int]]) -> int:
    """How many of `spans` hold the least held layer."""
    layers = range(max((end for _, end in spans), default=0))
    return min((sum(start <= layer < end for start, end in spans) for layer in layers), default=0)


class NodeProcess(Protocol):
    """What stopping a node needs of its process: a `Popen`, or a test's forked node."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int, /) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def stop_nodes(processes: Sequence[NodeProcess]) -> None:
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()  # reaped: a Popen collected while its child runs warns (an error in tests)


async def run_demo(
    runtime: RuntimeConfig,
    prompt: str,
    max_tokens: int,
    stream_answer: Callable[[AsyncIterator[dict[str, Any]]], Awaitable[RequestTrace | None]],
    print_trace: Callable[[RequestTrace | None], None],
) -> int:
    # converts the model once, before the nodes start; off the loop: it hashes the file
    context = await asyncio.to_thread(ModelContext.open, runtime)
    layers = context.num_layers
    per_node = -(-layers // NODES) + 1  # room for a bit more than a third: a three-way split
    memory = str(per_node * bytes_per_layer(context))
    ports = free_ports(NODES)
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="swarm-demo-") as state:
        try:
            first = f"127.0.0.1:{ports[0]}"
            for i, port in enumerate(ports):
                join = None if i == 0 else first
                flags = ["--layer-memory-bytes", memory, *_SHARED_MACHINE]
                processes.append(start_node(port, join, Path(state), runtime, flags))
            print(
                f"started {NODES} nodes on ports {ports}, "
                f"each with room for {per_node} of {layers} layers",
                file=sys.stderr,
            )
            status = await wait_for_coverage(first, NODES, READY_TIMEOUT_S)
            for m in status.members:
                span = "nothing" if m.span is None else f"{m.span[0]}:{m.span[1]}"
                print(f"  node {m.id} at {m.address} serves {span}", file=sys.stderr)
            print(f"\nQ: {prompt}\nA: ", end="", flush=True)
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            trace = await stream_answer(SwarmClient(first).chat(body))
            print_trace(trace)
        finally:
            stop_nodes(processes)
    return 0
