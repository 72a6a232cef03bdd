"""The least a hop can cost on this machine: what passing a decode step's frame from process to
process takes when no layer runs, against which `bench.swarm`'s overhead per hop is judged.

A ring of N processes; each receives a frame of one decode step's size, optionally hands it to
a worker thread and back (as a node hands a step to its compute thread), and sends it to the
next. With `--work-ms`, each hop also multiplies a matrix of `--sweep-mb` for that long per
frame (a hop's layers; on the worker thread where there is one), so that each process sits
idle between its turns as a swarm's hops do: the hop cost is then the trip's time less the
work. A matrix the size of a hop's layers (`--sweep-mb 32`: ten of the embedded model's)
streams through the caches as the layers' weights do, so what runs after it runs cold, as
in a node. Beside each figure, the CPU time a member's event loop (or socket loop) spent per
hop, the other members' mean. The transports:

* `socket`: blocking TCP sockets, no event loop (the kernel's and the machine's wake-up cost)
* `socket + codec`: the same, each hop opening the frame as a swarm decode step with swarm's
  `FrameCodec` (authenticated, its hidden state decoded) and sealing the next hop's: the
  least a Python hop pays for swarm's frames, without an event loop, batching or torch
  (sealed and opened by one C call each where `swarm.wire._frames` is built)
* `socket + Python codec`: the same with the C calls off (`FrameCodec(native=False)`)
* `asyncio`: asyncio streams
* `websocket`: aiohttp websockets, as swarm's links use

    python -m bench.hop_floor [--rounds 2000] [--bytes 2400] [--work-ms 0] [--sweep-mb 1]
        [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import socket
import statistics
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import cast

import aiohttp
import numpy as np
import torch
from aiohttp import web

from swarm.schema import HopTimes
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import FrameCodec, Hop, Peer, StepMessage, SwarmKeys

_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class Ring:
    """What every member of one ring is told."""

    ports: list[int]
    rounds: int
    size: int  # frame bytes
    kind: str  # socket, asyncio or websocket
    hand_off: bool  # through a worker thread and back
    work_ms: float  # on the worker thread, per frame
    uvloop: bool = False  # the event loop a node runs on, where installed
    sweep_mb: float = 1.0  # the work's matrix: what streams through the caches per product


def _work(body: bytes, ms: float, matrix: np.ndarray) -> tuple[bytes, float]:
    """Matrix-vector products (a hop's layers stand-in) for at least `ms` (a product of a big
    matrix may take longer): the frame back, and the milliseconds the work took."""
    started = time.perf_counter()
    end = started + ms / 1000
    vector = np.ones(matrix.shape[1], dtype=np.float32)
    result = np.empty(matrix.shape[0], dtype=np.float32)
    while time.perf_counter() < end:
        np.dot(matrix, vector, out=result)
    return body, (time.perf_counter() - started) * 1000


def _matrix(index: int, sweep_mb: float) -> np.ndarray:
    """The work's weights: 512 columns, as many rows as `sweep_mb` takes (50 us a product at
    1 MB)."""
    rows = max(1, int(sweep_mb * 2**20 / (512 * 4)))
    return np.random.default_rng(index).random((rows, 512), dtype=np.float32)


class _StepFrames:
    """A member's swarm frames: a decode step through a route of the ring's members, opened
    and sealed as a hop does (the step's timings grow by one per hop, as in a node, up to a
    route's worth: a result carries one per hop)."""

    def __init__(self, index: int, members: int, size: int, native: bool) -> None:
        self._ids = [NodeId(f"member-{i}") for i in range(members)]
        self._next = self._ids[(index + 1) % members]
        self._kept = members - 1  # timings a step keeps from the hops before
        self._codec = FrameCodec(SwarmKeys.loopback().frame, self._ids[index], native=native)
        route = tuple(
            Hop(node, f"127.0.0.1:{i}", LayerSpan(i, i + 1)) for i, node in enumerate(self._ids)
        )
        # random values, as a hop's hidden state: zeros would compress, and go the lz4 way
        hidden = torch.randn(1, 1, max(1, size // 4), generator=torch.Generator().manual_seed(0))
        self._first = StepMessage(
            SessionId("ring"), 0, 0, hidden, route[1:] or route, Peer(self._ids[0], "e"), ()
        )

    def first(self) -> bytes:
        return self._codec.encode(self._first, self._next)

    def onward(self, frame: bytes) -> bytes:
        step = cast(StepMessage, self._codec.decode(frame, StepMessage).message)
        timing = HopTimes(self._codec.sender, 0.1, 1.0, 0.1, 0.1, 0.0, 0.1)
        rest = step.route[1:] or step.route
        onward = replace(
            step,
            step=step.step + 1,
            position=step.position + 1,
            route=rest,
            timings=(*step.timings[len(step.timings) - self._kept + 1 :], timing)
            if self._kept > 1
            else (timing,),
        )
        return self._codec.encode(onward, self._next)


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly `n` bytes from `sock`, into one writable buffer."""
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        chunk = sock.recv_into(view[got:])
        if not chunk:
            raise ConnectionError("peer closed")
        got += chunk
    return data


def join_ring(index: int, ports: list[int], out: Connection) -> tuple[socket.socket, socket.socket]:
    """A ring member's sockets: (to the next member, from the one before), once every member
    listens (each says so on `out` and waits for the word to go on)."""
    server = socket.create_server(("127.0.0.1", ports[index]))
    out.send("listening")
    out.recv()  # every member listens
    onward = socket.create_connection(("127.0.0.1", ports[(index + 1) % len(ports)]))
    onward.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back, _ = server.accept()
    server.close()
    return onward, back


def _socket_member(index: int, ring: Ring, out: Connection) -> None:
    ports, rounds, size = ring.ports, ring.rounds, ring.size
    matrix = _matrix(index, ring.sweep_mb)
    codec = ring.kind != "socket"
    frames = _StepFrames(index, len(ports), size, ring.kind == "codec") if codec else None
    nxt, prev = join_ring(index, ports, out)
    stamps: list[float] = []
    worked: list[float] = []  # ms of work in each round
    cpu = time.thread_time()
    body = bytes(size) if frames is None else frames.first()
    for _ in range(rounds):
        if index == 0:
            stamps.append(time.perf_counter())
            nxt.sendall(_HEADER.pack(len(body)) + body)
        length = _HEADER.unpack(recv_exact(prev, _HEADER.size))[0]
        body = recv_exact(prev, length)
        if ring.work_ms:  # every member, as every member of the other rings
            worked.append(_work(body, ring.work_ms, matrix)[1])
        if frames is not None:
            body = frames.onward(body)
        if index != 0:
            nxt.sendall(_HEADER.pack(len(body)) + body)
    stamps.append(time.perf_counter())
    # the socket's thread also works: its CPU per hop is what the work leaves
    out.send((stamps, ((time.thread_time() - cpu) * 1000 - sum(worked)) / rounds, worked))


async def _async_member(index: int, ring: Ring, out: Connection) -> None:
    ports, rounds, size, kind = ring.ports, ring.rounds, ring.size, ring.kind
    hand_off, work_ms = ring.hand_off, ring.work_ms
    pool = ThreadPoolExecutor(1)
    matrix = _matrix(index, ring.sweep_mb)
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        async for message in ws:
            inbox.put_nowait(message.data)
        return ws

    async def on_stream(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        try:
            while True:
                length = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
                inbox.put_nowait(await reader.readexactly(length))
        except (asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # the ring is done (its loop may end before the peer's writer closes)

    if kind == "websocket":
        app = web.Application()
        app.router.add_get("/", on_socket)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", ports[index]).start()
    else:
        await asyncio.start_server(on_stream, "127.0.0.1", ports[index])
    out.send("listening")
    await loop.run_in_executor(None, out.recv)
    target = f"127.0.0.1:{ports[(index + 1) % len(ports)]}"
    session = aiohttp.ClientSession()
    if kind == "websocket":
        ws = await session.ws_connect(f"http://{target}/")

        async def send(body: bytes) -> None:
            await ws.send_bytes(body)
    else:
        _, writer = await asyncio.open_connection("127.0.0.1", ports[(index + 1) % len(ports)])

        async def send(body: bytes) -> None:
            writer.write(_HEADER.pack(len(body)) + body)
            await writer.drain()

    stamps: list[float] = []
    worked: list[float] = []  # ms of work in each round
    cpu = time.thread_time()  # this thread's: the event loop's, not the worker's
    for _ in range(rounds):
        if index == 0:
            stamps.append(time.perf_counter())
            await send(bytes(size))
        body = await inbox.get()
        if hand_off:
            body, ms = await loop.run_in_executor(pool, _work, body, work_ms, matrix)
            worked.append(ms)
        if index != 0:
            await send(body)
    stamps.append(time.perf_counter())
    out.send((stamps, (time.thread_time() - cpu) * 1000 / rounds, worked))
    await session.close()


def _member(index: int, ring: Ring, out: Connection) -> None:
    if ring.kind in ("socket", "codec", "pycodec"):
        _socket_member(index, ring, out)
    elif ring.uvloop:
        import uvloop

        uvloop.run(_async_member(index, ring, out))
    else:
        asyncio.run(_async_member(index, ring, out))


def ring(
    n: int,
    rounds: int,
    size: int,
    kind: str,
    hand_off: bool,
    work_ms: float = 0,
    uvloop: bool = False,
    sweep_mb: float = 1.0,
) -> tuple[float, float]:
    """Median milliseconds per hop over `rounds` trips around a ring of n processes, less the
    work each hop does; and the CPU milliseconds per hop of a member's loop thread (the mean
    of every member but the first, which also keeps the time)."""
    from swarm.demo import free_ports

    ports = free_ports(n)
    context = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for i in range(n):
        mine, theirs = context.Pipe()
        ring_of = Ring(ports, rounds, size, kind, hand_off, work_ms, uvloop, sweep_mb)
        proc = context.Process(target=_member, args=(i, ring_of, theirs))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    for p in pipes:
        assert p.recv() == "listening"
    for p in pipes:
        p.send("go")
    reports = [p.recv() for p in pipes]
    stamps = reports[0][0]
    cpu = statistics.mean(r[1] for r in reports[1:])
    for proc in procs:
        proc.join()
    # each trip less the work every member did in it, as measured
    work = [sum(r[2][i] for r in reports) if reports[0][2] else 0.0 for i in range(rounds)]
    trips = [(b - a) * 1000 - w for (a, b), w in zip(itertools.pairwise(stamps), work, strict=True)]
    return statistics.median(trips[rounds // 10 :]) / n, cpu


def main() -> None:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one core per hop, as the nodes' one torch thread
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=2400, help="a decode step's frame")
    parser.add_argument("--work-ms", type=float, default=0, help="per hop, on the worker thread")
    parser.add_argument("--sweep-mb", type=float, default=1.0, help="the work's matrix, MB")
    parser.add_argument("--uvloop", action="store_true", help="run the event loops on uvloop")
    args = parser.parse_args()
    print(f"ms per hop, median of {args.rounds} trips, {args.bytes}-byte frames", end="")
    if args.work_ms:
        print(
            f", {args.work_ms} ms of work per hop over {args.sweep_mb:g} MB (not counted)", end=""
        )
    print(", uvloop" if args.uvloop else "")
    print("wall / loop CPU per hop")
    print(f"{'transport':24}" + "".join(f"{f'{n} procs':>16}" for n in (2, 3)))
    names = {"codec": "socket + codec", "pycodec": "socket + Python codec"}
    for kind, hand_off in (
        ("socket", False),
        ("codec", False),
        ("pycodec", False),
        ("asyncio", False),
        ("asyncio", True),
        ("websocket", False),
        ("websocket", True),
    ):
        name = names.get(kind, kind) + (" + thread" if hand_off else "")
        figures = [
            ring(
                n, args.rounds, args.bytes, kind, hand_off, args.work_ms, args.uvloop, args.sweep_mb
            )
            for n in (2, 3)
        ]
        print(f"{name:24}" + "".join(f"{w:8.3f} /{c:6.3f}" for w, c in figures), flush=True)


if __name__ == "__main__":
    main()
