"""A peer that only sends weights, as its own process, so a test can kill -9 it mid-transfer:

    python -m tests.transfer_sender MODEL CACHE RATE_BYTES_PER_S

prints `port N` once it listens on 127.0.0.1, then serves until killed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from swarm.runtime.store import ModelStore
from swarm.transfer.protocol import TRANSFER_PATH, TransferCodec
from swarm.transfer.server import TransferServer
from swarm.types import NodeId

KEY = b"k" * 32  # the tests' frame key


async def serve(model: str, cache: Path, rate: float) -> None:
    store = ModelStore.open(model, cache)
    server = TransferServer(store, TransferCodec(KEY, NodeId("sender")), rate, lambda: [])
    app = web.Application()
    app.router.add_post(TRANSFER_PATH, server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"port {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])))
