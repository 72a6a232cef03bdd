"""The least a hop can cost on this machine: what passing a decode step's frame from process to
process takes when no layer runs, against which `bench.swarm`'s overhead per hop is judged.

A ring of N processes; each receives a frame of one decode step's size, optionally hands it to
a worker thread and back (as a node hands a step to its compute thread), and sends it to the
next. With `--work-ms`, the worker thread also multiplies a matrix for that long per frame (a
hop's layers), so that each process sits idle between its turns as a swarm's hops do: the hop
cost is then the trip's time less the work. Beside each figure, the CPU time a member's event
loop (or socket loop) spent per hop, the other members' mean. Three transports:

* `socket`: blocking TCP sockets, no event loop (the kernel's and the machine's wake-up cost)
* `asyncio`: asyncio streams
* `websocket`: aiohttp websockets, as swarm's links use

    python -m bench.hop_floor [--rounds 2000] [--bytes 2400] [--work-ms 0] [--uvloop]
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
from dataclasses import dataclass
from multiprocessing.connection import Connection

import aiohttp
import numpy as np
from aiohttp import web

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


def _work(body: bytes, ms: float, matrix: np.ndarray) -> bytes:
    """`ms` of matrix-vector products (a hop's layers stand-in), then the frame back."""
    end = time.perf_counter() + ms / 1000
    vector = np.ones(matrix.shape[1], dtype=np.float32)
    while time.perf_counter() < end:
        vector = matrix @ vector / matrix.shape[1]
    return body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def _socket_member(index: int, ports: list[int], rounds: int, size: int, out: Connection) -> None:
    server = socket.create_server(("127.0.0.1", ports[index]))
    out.send("listening")
    out.recv()  # every member listens
    nxt = socket.create_connection(("127.0.0.1", ports[(index + 1) % len(ports)]))
    nxt.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    prev, _ = server.accept()
    frame = _HEADER.pack(size) + bytes(size)
    stamps = []
    cpu = time.thread_time()
    for _ in range(rounds):
        if index == 0:
            stamps.append(time.perf_counter())
            nxt.sendall(frame)
        length = _HEADER.unpack(_recv_exact(prev, _HEADER.size))[0]
        body = _recv_exact(prev, length)
        if index != 0:
            nxt.sendall(_HEADER.pack(len(body)) + body)
    stamps.append(time.perf_counter())
    out.send((stamps, (time.thread_time() - cpu) * 1000 / rounds))


async def _async_member(index: int, ring: Ring, out: Connection) -> None:
    ports, rounds, size, kind = ring.ports, ring.rounds, ring.size, ring.kind
    hand_off, work_ms = ring.hand_off, ring.work_ms
    pool = ThreadPoolExecutor(1)
    matrix = np.random.default_rng(index).random((512, 512), dtype=np.float32)  # ~50 us a product
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
        except asyncio.IncompleteReadError:
            return  # the ring is done

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

    stamps = []
    cpu = time.thread_time()  # this thread's: the event loop's, not the worker's
    for _ in range(rounds):
        if index == 0:
            stamps.append(time.perf_counter())
            await send(bytes(size))
        body = await inbox.get()
        if hand_off:
            body = await loop.run_in_executor(pool, _work, body, work_ms, matrix)
        if index != 0:
            await send(body)
    stamps.append(time.perf_counter())
    out.send((stamps, (time.thread_time() - cpu) * 1000 / rounds))
    await session.close()


def _member(index: int, ring: Ring, out: Connection) -> None:
    if ring.kind == "socket":
        _socket_member(index, ring.ports, ring.rounds, ring.size, out)
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
        ring_of = Ring(ports, rounds, size, kind, hand_off, work_ms, uvloop)
        proc = context.Process(target=_member, args=(i, ring_of, theirs))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    for p in pipes:
        assert p.recv() == "listening"
    for p in pipes:
        p.send("go")
    stamps, _ = pipes[0].recv()
    cpu = statistics.mean(p.recv()[1] for p in pipes[1:])
    for proc in procs:
        proc.join()
    trips = [b - a for a, b in itertools.pairwise(stamps)][rounds // 10 :]
    return statistics.median(trips) * 1000 / n - (work_ms if hand_off else 0), cpu


def main() -> None:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one core per hop, as the nodes' one torch thread
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=2400, help="a decode step's frame")
    parser.add_argument("--work-ms", type=float, default=0, help="per hop, on the worker thread")
    parser.add_argument("--uvloop", action="store_true", help="run the event loops on uvloop")
    args = parser.parse_args()
    print(f"ms per hop, median of {args.rounds} trips, {args.bytes}-byte frames", end="")
    print(f", {args.work_ms} ms of work per hop (not counted)" if args.work_ms else "", end="")
    print(", uvloop" if args.uvloop else "")
    print("wall / loop CPU per hop")
    print(f"{'transport':24}" + "".join(f"{f'{n} procs':>16}" for n in (2, 3)))
    for kind, hand_off in (
        ("socket", False),
        ("asyncio", False),
        ("asyncio", True),
        ("websocket", False),
        ("websocket", True),
    ):
        name = kind + (" + thread" if hand_off else "")
        figures = [
            ring(n, args.rounds, args.bytes, kind, hand_off, args.work_ms, args.uvloop)
            for n in (2, 3)
        ]
        print(f"{name:24}" + "".join(f"{w:8.3f} /{c:6.3f}" for w, c in figures), flush=True)


if __name__ == "__main__":
    main()
