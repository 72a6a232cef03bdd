"""The gossiper: drives the pure SWIM state machine (`protocol`) with real time, randomness
and HTTP. Messages are wire frames under the gossip key, POSTed to a peer's /gossip; losing
one is fine, as it would be over UDP. Anything malformed or unauthenticated changes nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from random import Random

import aiohttp
from aiohttp import web

from swarm.config import MembershipConfig
from swarm.errors import FrameError
from swarm.membership import protocol
from swarm.membership.messages import Message, Send
from swarm.membership.view import MembershipView
from swarm.membership.wire_format import message_from_wire, message_to_wire
from swarm.types import MemberRecord, NodeId
from swarm.wire import FrameCodec, GossipFrame

log = logging.getLogger(__name__)

GOSSIP_PATH = "/gossip"
_INCOMING = 1024  # messages waiting; beyond this, new ones are dropped like lost packets
_SEND_TIMEOUT_S = 2.0


class Gossiper:
    def __init__(
        self,
        config: MembershipConfig,
        record: MemberRecord,
        codec: FrameCodec,
        rng: Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._codec = codec
        self._rng = rng or Random()
        self._clock = clock
        self._state = protocol.start(config, record, clock(), self._rng)
        self._incoming: asyncio.Queue[Message] = asyncio.Queue(maxsize=_INCOMING)
        self._http: aiohttp.ClientSession | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()  # set whenever the view changes; readers clear it
        self.rejected = 0

    @property
    def view(self) -> MembershipView:
        return self._state.view

    @property
    def local(self) -> MemberRecord:
        return self._state.local

    async def run(self, join: Sequence[str]) -> None:
        """Join through `join` (the protocol asks again while it knows no one), then serve."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_SEND_TIMEOUT_S))
        try:
            self._apply(protocol.join(self._state, join))
            while True:
                delay = protocol.next_wakeup(self._state) - self._clock()
                await self._wait(max(0.0, delay))
        finally:
            await self._close()

    async def _wait(self, delay: float) -> None:
        try:
            async with asyncio.timeout(delay):
                message = await self._incoming.get()
        except TimeoutError:
            self._apply(protocol.poll(self._state, self._clock(), self._rng))
            return
        self._apply(protocol.receive(self._state, message, self._clock(), self._rng))

    def update_record(self, record: MemberRecord) -> None:
        """Publish a changed local record (span, load, speed) under a higher incarnation."""
        self._apply(protocol.announce(self._state, record, self._clock()))

    def suspect(self, node_id: NodeId) -> None:
        """Another part of the node saw `node_id` fail: suspect it now rather than wait for the
        probe round to reach it."""
        self._apply(protocol.suspect(self._state, node_id, self._clock(), self._rng))

    async def leave(self) -> None:
        """Announce a graceful leave and give the messages a moment to go out."""
        self._apply(protocol.leave(self._state, self._clock(), self._rng))
        if self._sends:
            await asyncio.wait(self._sends, timeout=_SEND_TIMEOUT_S)

    async def handle(self, request: web.Request) -> web.Response:
        """POST /gossip: one frame. 204 when taken, 400 when refused."""
        body = await request.read()
        try:
            received = self._codec.decode(body)
            frame = received.message
            if not isinstance(frame, GossipFrame):
                raise FrameError("not a gossip frame")
            message = message_from_wire(frame.kind, frame.fields)
            if message.sender != received.sender:
                raise FrameError(f"frame from {received.sender} claims to be from {message.sender}")
        except FrameError as e:
            self.rejected += 1
            log.warning("refused gossip from %s: %s", request.remote, e)
            return web.Response(status=400, text=str(e))
        try:
            self._incoming.put_nowait(message)
        except asyncio.QueueFull:
            log.debug("gossip inbox full; dropping a message")
        return web.Response(status=204)

    def _apply(self, step: protocol.Step) -> None:
        self._state = step.node
        if step.changes:
            self.changed.set()
        for send in step.sends:
            task = asyncio.create_task(self._post(send))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _post(self, send: Send) -> None:
        if self._http is None or self._http.closed:
            return
        kind, fields = message_to_wire(send.message)
        data = self._codec.encode(GossipFrame(kind, fields))
        try:
            async with self._http.post(f"http://{send.address}{GOSSIP_PATH}", data=data) as reply:
                if reply.status != 204:
                    log.debug("gossip to %s refused: %s", send.address, await reply.text())
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.debug("gossip to %s lost: %s", send.address, e or type(e).__name__)

    async def _close(self) -> None:
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
