"""The sending side: answers peers' index, digest and chunk requests for the model this node
serves, reading its store off the event loop and pacing each peer to a byte rate, so a
transfer never takes the bandwidth activation frames need."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from swarm.errors import FrameError, ModelError
from swarm.net.bodies import BodyTooLarge, read_body
from swarm.runtime.checkpoint.store import ModelStore, answers_to
from swarm.transfer.protocol import (
    MAX_REQUEST_BYTES,
    Ask,
    Reply,
    Request,
    TransferCodec,
)
from swarm.types import NodeId
from swarm.wire import NODE_HEADER
from swarm.wire.auth import ReplayWindow

log = logging.getLogger(__name__)

_REPLAY_WINDOW = 30_000_000  # microseconds of a sender's clock, as for frames
_MAX_SENDERS = 1024


@dataclass
class Pace:
    """A token bucket: at most `rate` bytes per second, bursts of one second's worth."""

    rate: float  # bytes per second; 0 = unlimited
    clock: Callable[[], float] = time.monotonic
    _level: float = 0.0
    _at: float = field(default_factory=time.monotonic)

    async def take(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        now = self.clock()
        self._level = min(self.rate, self._level + (now - self._at) * self.rate) - nbytes
        self._at = now
        if self._level < 0:
            await asyncio.sleep(-self._level / self.rate)


class TransferServer:
    def __init__(
        self,
        store: ModelStore,
        codec: TransferCodec,
        rate_bytes_per_s: float,
        peers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._codec = codec
        self._rate = rate_bytes_per_s
        self._peers = peers  # addresses of the members serving this model, for the index
        self._paces: dict[NodeId, Pace] = {}
        self._replay = ReplayWindow(_REPLAY_WINDOW, _MAX_SENDERS)
        self.sent_bytes = 0
        self.refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        """POST TRANSFER_PATH: 200 with a sealed reply, 400 for a refused request, 413 for
        one over MAX_REQUEST_BYTES, 421 with this node's id for one sealed for another."""
        try:
            body = await read_body(request, MAX_REQUEST_BYTES)
        except BodyTooLarge as e:
            self.refused += 1
            return web.Response(status=413, text=str(e))
        try:
            opened = self._codec.open_request(body)
            if opened.receiver == self._codec.me:
                self._replay.accept(opened.sender, opened.counter)
        except FrameError as e:
            self.refused += 1
            log.debug("refused a transfer request from %s: %s", request.remote, e)
            return web.Response(status=400, text=str(e))
        if opened.receiver != self._codec.me:
            # the sender learns whom to address (its first request names nobody); one that
            # names another node was sealed for it: a replay, refused as such
            self.refused += bool(opened.receiver)
            why = f"this is node {self._codec.me}, not {opened.receiver or 'unnamed'}"
            return web.Response(status=421, text=why, headers={NODE_HEADER: self._codec.me})
        reply = await self._answer(opened.sender, opened.request)
        return web.Response(body=self._codec.seal_reply(opened.counter, reply))

    async def _answer(self, sender: NodeId, ask: Request) -> Reply:
        store = self._store
        if ask.ask is Ask.INDEX:
            if not answers_to(store.manifest, ask.model):
                return Reply({"error": f"this swarm serves {store.manifest.model_id}"})
            files = await asyncio.to_thread(store.index_files)
            return Reply(
                {
                    "model_id": store.manifest.model_id,
                    "files": files,
                    "peers": list(self._peers()),
                }
            )
        if ask.model != store.manifest.model_id:
            return Reply({"error": f"this node serves model {store.manifest.model_id}"})
        if ask.part not in store.manifest.parts:
            return Reply({"error": f"no part {ask.part!r}"})
        try:
            digest = await asyncio.to_thread(store.digest, ask.part)
        except ModelError as e:
            log.warning("cannot serve %s: %s", ask.part, e)
            return Reply({"error": str(e)})
        if digest is None:
            return Reply({"error": "not held"})
        if ask.ask is Ask.DIGEST:
            # a node with the model file hashed the part it cut from that file: fetchers trust
            # its digest over any number of copies
            return Reply({"digest": digest.to_json(), "from_file": store.has_checkpoint})
        if not 0 <= ask.chunk < len(digest.chunks):
            return Reply({"error": f"no chunk {ask.chunk} in {ask.part}"})
        start, end = digest.chunk_range(ask.chunk)
        await self._paces.setdefault(sender, Pace(self._rate)).take(end - start)
        data = await asyncio.to_thread(store.read_range, ask.part, start, end)
        self.sent_bytes += len(data)
        return Reply({}, data)
