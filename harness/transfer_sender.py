"""A peer that only sends weights, as its own process, so a test can kill -9 it mid-transfer:

    python -m harness.transfer_sender MODEL CACHE RATE_BYTES_PER_S

prints `port N` once it listens on 127.0.0.1, then serves until killed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from swarm.runtime.checkpoint.store import ModelStore
from swarm.transfer.protocol import TRANSFER_PATH, TransferCodec
from swarm.transfer.server import TransferServer
from swarm.types import NodeId

KEY = b"k" * 32  # the tests' frame key


async def start(
    store: ModelStore, name: str, key: bytes = KEY, rate: float = 0
) -> tuple[web.AppRunner, str, TransferServer]:
    """A transfer server for `store` listening on a free loopback port: its runner (to clean
    up), its address and the server."""
    server = TransferServer(store, TransferCodec(key, NodeId(name)), rate, lambda: [])
    app = web.Application()
    app.router.add_post(TRANSFER_PATH, server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}", server


async def serve(model: str, cache: Path, rate: float) -> None:
    _, address, _ = await start(ModelStore.open(model, cache), "sender", KEY, rate)
    print(f"port {address.rsplit(':', 1)[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])))
