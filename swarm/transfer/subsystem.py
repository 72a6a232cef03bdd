"""The transfer subsystem: weights to and from peers. It opens the model (from the file here,
or from the index and parts peers or a hub send), brings the parts of a new span before the
hop side serves it, and answers peers' index, digest and chunk requests. The node sees only
this façade: its parts (the peer client, the fetcher, the sending side) stay inside."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from swarm.config import Config
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.model import ModelContext
from swarm.schema import TransferReport
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.protocol import MAX_REQUEST_BYTES, TRANSFER_PATH, TransferCodec
from swarm.transfer.server import TransferServer
from swarm.transfer.supply import open_model
from swarm.types import NodeId
from swarm.wire import clock_limits

__all__ = ["MAX_REQUEST_BYTES", "TRANSFER_PATH", "Transfer"]


@dataclass
class Transfer:
    _client: PeerClient
    _fetcher: Fetcher
    _server: TransferServer

    @classmethod
    async def open(
        cls,
        config: Config,
        frame_key: bytes,
        me: NodeId,
        compute: ComputeThread,
        members: Callable[[], Sequence[str]],
        restarts: bool,
    ) -> tuple[Transfer, ModelContext]:
        """The subsystem and the model context, with every part an entry and the speed probe
        need in the store. `members`: the addresses of the members serving this model now
        (told to a peer that asks for the index), read only when a peer asks; `restarts`:
        this node's id ran before (`swarm.identity.ran_before`)."""
        limits = clock_limits(config.net.max_clock_ahead_s)
        codec = TransferCodec(frame_key, me, limits, restarts=restarts)
        client = PeerClient(codec, config.transfer.request_timeout_s)
        try:
            context, fetcher = await open_model(config, client, compute)
        except BaseException:
            await client.close()
            raise
        server = TransferServer(context.store, codec, config.transfer.rate_bytes_per_s, members)
        return cls(client, fetcher, server), context

    async def handle(self, request: web.Request) -> web.Response:
        """POST TRANSFER_PATH, a peer asking for the index, a digest or a chunk."""
        return await self._server.handle(request)

    async def ensure(self, parts: Sequence[str], peers: Sequence[str]) -> None:
        """Fetch those of `parts` the store lacks from `peers`; TransferError when some part
        cannot be had from any of them."""
        await self._fetcher.ensure(parts, peers)

    def missing_layer_bytes(self, num_layers: int) -> tuple[int, ...]:
        """Per layer of the model, the bytes of its part the store lacks (0 where stored)."""
        return self._fetcher.missing_layer_bytes(num_layers)

    def rate_bytes_per_s(self) -> float:
        """The rate fetches reached so far, or the configured per-link limit before any."""
        return self._fetcher.rate_bytes_per_s()

    async def run(self) -> None:
        """Nothing runs on its own here: fetches are asked for, requests arrive over HTTP."""

    async def drain(self) -> None:
        """Nothing to hand over: a peer fetching from this node fetches from another."""

    def status(self) -> TransferReport:
        return self._fetcher.report(self._server.sent_bytes)

    async def close(self) -> None:
        await self._client.close()
