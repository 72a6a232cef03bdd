"""The gossiper: drives the pure SWIM state machine (`protocol`) with real time, randomness
and HTTP. Messages are wire frames under the gossip key, POSTed to a peer's /gossip; losing
one is fine, as it would be over UDP. Anything malformed or unauthenticated changes nothing.

Every frame names its receiver's node id. A join's first frame goes to an address behind which
the sender knows no id yet: the receiver answers 421 with its id (`NODE_HEADER`), and the
sender seals the frame again for it. So a frame captured on its way opens only at the
node it was sealed for."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from random import Random

import aiohttp
from aiohttp import web

from swarm.config import MembershipConfig
from swarm.errors import FrameError, MisaddressedError
from swarm.logs import Refusals, Throttle
from swarm.membership import protocol
from swarm.membership.address_book import AddressBook
from swarm.membership.messages import Message, Ping, PushPull, Send
from swarm.membership.rejoin import Unanswered, warn_unanswered
from swarm.membership.view import MembershipView
from swarm.membership.wire_format import message_from_wire, message_to_wire
from swarm.net.addresses import observed_host
from swarm.net.bodies import BodyTooLarge, read_body
from swarm.types import MemberRecord, MemberState, NodeId, split_host_port
from swarm.wire import NODE_HEADER, FrameCodec, GossipFrame

log = logging.getLogger(__name__)

GOSSIP_PATH = "/gossip"
# A gossip answer carries the address its sender was seen connecting from, so that a node can
# check the address it advertises against what its peers see (a join answer confirms it).
OBSERVED_HEADER = "X-Swarm-Observed-Address"
# A refused gossip frame's answer names the cause as /status counts it (`FrameRefusal`):
# `swarm doctor` seals a probe with the secret it was given and reads why a node refuses it.
REFUSAL_HEADER = "X-Swarm-Refused"
# A ping for this target tests only that the frame opens: the node answers 204 and nothing
# else happens (no ack, no merge, and it does not count as a peer's message arriving).
KEY_PROBE_TARGET = NodeId("-")
# a full state of a few hundred members fits many times over; the app-wide body limit is for
# node-to-node frames, which are much larger
GOSSIP_BODY_BYTES = 4 * 1024 * 1024
_LOG_INTERVAL_S = 60.0  # at most one line per peer and kind of trouble per this many seconds
_INCOMING = 1024  # messages waiting; beyond this, new ones are dropped like lost packets
_SEND_TIMEOUT_S = 2.0
_BOOK_REFRESH_S = 60.0  # the address book is rewritten at least this often while it changes
_NAMED_MAX = 256  # ids learned from 421 answers, by address; forgotten all at once past this


class Gossiper:
    def __init__(
        self,
        config: MembershipConfig,
        record: MemberRecord,
        codec: FrameCodec,
        rng: Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        book: AddressBook | None = None,
    ) -> None:
        """`book`: where the addresses of members seen alive are kept across restarts."""
        self._config = config
        self._book = book
        self._booked: tuple[tuple[str, ...], float] = ((), 0.0)  # addresses saved, and when
        self._codec = codec
        self._rng = rng or Random()
        self._clock = clock
        self._state = protocol.start(config, record, clock(), self._rng)
        self._started = clock()
        self._heard_at: float | None = None  # when a peer's message last arrived
        self._heard_from: dict[NodeId, float] = {}  # when each member's message last arrived
        self._answered_since_heard = 0  # our messages peers took since then
        self._joined = False
        self._unanswered: dict[str, Unanswered] = {}  # --join addresses whose joins failed
        self._throttle = Throttle(_LOG_INTERVAL_S)
        # peers whose /gossip could not be reached from here, and since when
        self.unreachable: dict[str, float] = {}
        self._incoming: asyncio.Queue[Message] = asyncio.Queue(maxsize=_INCOMING)
        self._http: aiohttp.ClientSession | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._named: dict[str, NodeId] = {}  # the ids 421 answers named, by address
        self.changed = asyncio.Event()  # set whenever the view changes; readers clear it
        self.refusals = Refusals(log, "gossip")

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
            # answers to joins sent sooner would be refused (a restarted node's first moments)
            await asyncio.sleep(self._codec.takes_in_s())
            self._apply(protocol.join(self._state, join, await self._remembered()))
            while True:
                delay = protocol.next_wakeup(self._state) - self._clock()
                await self._wait(max(0.0, delay))
        finally:
            await self._close()

    async def _remembered(self) -> list[tuple[str, float]]:
        """The address book's entries on this gossiper's clock."""
        if self._book is None:
            return []
        pairs = await asyncio.to_thread(self._book.load)
        offset = self._clock() - time.time()
        return [(address, seen + offset) for address, seen in pairs]

    def _keep_addresses(self) -> None:
        """Save the remembered addresses when their set changed, or now and then while it
        stays the same (their times move on)."""
        remembered = self._state.remembered
        saved, at = self._booked
        now = self._clock()
        if self._book is None or (remembered.addresses == saved and now - at < _BOOK_REFRESH_S):
            return
        self._booked = (remembered.addresses, now)
        offset = time.time() - now
        seen = [(address, t + offset) for address, t in remembered.seen]
        task = asyncio.create_task(asyncio.to_thread(self._book.save, seen))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

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

    def discovered(self, address: str) -> None:
        """A member of this swarm announces itself at `address`: join it."""
        self._apply(protocol.discovered(self._state, address))

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
        """POST /gossip: one frame. 204 when taken, 400 when refused, 413 when over
        GOSSIP_BODY_BYTES (refused before reading, from its declared length), 421 with this
        node's id for an authentic frame that names no receiver or another."""
        peer = request.remote or "?"
        try:
            body = await read_body(request, GOSSIP_BODY_BYTES)
        except BodyTooLarge as e:
            self.refusals.refuse("body_too_large", peer, str(e))
            return web.Response(status=413, text=str(e))
        try:
            received = self._codec.decode(body, GossipFrame)
            frame = received.message
            if not isinstance(frame, GossipFrame):  # decode made sure; this tells mypy
                raise FrameError("not a gossip frame")
            message = message_from_wire(frame.kind, frame.fields)
            if message.sender != received.sender:
                raise FrameError(f"frame from {received.sender} claims to be from {message.sender}")
        except MisaddressedError as e:
            # a join's first frame names nobody: its sender learns whom to seal it for (ids are
            # no secret), the handshake, not a refusal; one sealed for another node may be
            # replayed from its way there, or two nodes share an address
            if e.receiver:
                self.refusals.refuse("misaddressed", peer, str(e))
            headers = {NODE_HEADER: self._codec.sender, REFUSAL_HEADER: e.refusal}
            return web.Response(status=421, text=str(e), headers=headers)
        except FrameError as e:
            self.refusals.refuse(e.refusal, peer, str(e))
            return web.Response(status=400, text=str(e), headers={REFUSAL_HEADER: e.refusal})
        if isinstance(message, Ping) and message.target == KEY_PROBE_TARGET:
            return web.Response(status=204)
        self._heard_at = self._heard_from[message.sender] = self._clock()
        self._answered_since_heard = 0
        try:
            self._incoming.put_nowait(message)
        except asyncio.QueueFull:
            log.debug("gossip inbox full; dropping a message")
        return web.Response(status=204, headers={OBSERVED_HEADER: request.remote or ""})

    @property
    def unreachable_here(self) -> bool:
        """Peers take this node's messages but none of theirs arrive: they cannot reach the
        address it advertises. Known within the failure-detection time."""
        if self._answered_since_heard < 3:
            return False
        since = self._started if self._heard_at is None else self._heard_at
        return self._clock() - since > self._detection_s()

    def _detection_s(self) -> float:
        members = len(self.view.live_ids)
        return self._config.probe_interval_s + self._config.suspicion_timeout_s(members)

    def _apply(self, step: protocol.Step) -> None:
        before = self._state.view
        self._state = step.node
        if step.changes:
            self.changed.set()
            self._log_changes(before, {u.node_id for u in step.changes})
            self._forget_unlisted()
        for send in step.sends:
            task = asyncio.create_task(self._post(send))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        self._keep_addresses()

    def _forget_unlisted(self) -> None:
        """Keep `unreachable` and `_heard_from` to the addresses and members the view still
        lists: members reclaimed after their death, or peers that moved, would otherwise
        stay in them for the node's life."""
        listed = {e.record.address for e in self.view if e.record is not None}
        for address in [a for a in self.unreachable if a not in listed]:
            del self.unreachable[address]
        for node_id in [n for n in self._heard_from if n not in self.view]:
            del self._heard_from[node_id]

    def heard_s_ago(self, node_id: NodeId) -> float | None:
        """Seconds since a gossip message from `node_id` last arrived; None if none has."""
        heard = self._heard_from.get(node_id)
        return None if heard is None else self._clock() - heard

    async def _post(self, send: Send) -> None:
        if self._http is None or self._http.closed:
            return
        join = isinstance(send.message, PushPull) and send.message.join
        try:
            status, text, observed = await self._deliver(self._http, send)
            self.unreachable.pop(send.address, None)
            if status != 204:
                log.debug("gossip to %s refused: %s", send.address, text)
                if join:
                    self._join_unanswered(send.address, f"it refused: {text.strip()}")
                return
            if join:
                self._unanswered.pop(send.address, None)
                self._check_observed(send.address, observed)
            self._answered()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.unreachable.setdefault(send.address, self._clock())
            log.debug("gossip to %s lost: %s", send.address, e or type(e).__name__)
            if join:
                self._join_unanswered(send.address, _why_lost(e))

    async def _deliver(
        self, http: aiohttp.ClientSession, send: Send
    ) -> tuple[int, str, str | None]:
        """POST `send`'s frame, sealed for the member at its address; sealed again once for the
        id a 421 names (the id behind a bootstrap address is not known before). The status,
        the text of an answer other than 204, and the address the receiver saw this node at."""
        kind, fields = message_to_wire(send.message)
        receiver = self._id_at(send.address)
        for again in (True, False):
            data = self._codec.encode(GossipFrame(kind, fields), receiver)
            async with http.post(f"http://{send.address}{GOSSIP_PATH}", data=data) as reply:
                named = reply.headers.get(NODE_HEADER) if reply.status == 421 else None
                if again and named and named != receiver and len(named.encode()) <= 255:
                    if len(self._named) >= _NAMED_MAX:
                        self._named.clear()
                    receiver = self._named[send.address] = NodeId(named)
                    continue
                text = "" if reply.status == 204 else await reply.text()
                return reply.status, text, reply.headers.get(OBSERVED_HEADER)
        raise AssertionError("unreachable: the second answer returns")

    def _join_unanswered(self, address: str, why: str) -> None:
        """A join to `address` failed: warn, backed off, while this node knows no one and
        `address` is a --join address. (One it remembered is a member that went away, and
        a node that knows others already has a swarm: the view says who left it.)"""
        if address not in self._state.seeds or len(self.view.live_ids) > 1:
            return
        state = self._unanswered.get(address, Unanswered())
        self._unanswered[address], due = warn_unanswered(state, self._clock(), self._config)
        if due:
            log.warning(
                "cannot join through %s (%s): serving alone, asking again until it answers",
                address,
                why,
            )

    def clock_skew_ms(self) -> dict[str, float]:
        """Per peer id: this node's clock minus the peer's, as its gossip frames tell (ms)."""
        return self._codec.clock_skew_ms()

    def _id_at(self, address: str) -> NodeId | None:
        """The member at `address`, a live one first, to address the frame to; else the id a
        421 from it named; None for an address no record names yet and none answered."""
        found = self._named.get(address)
        for entry in self.view:
            if entry.record is not None and entry.record.address == address:
                if entry.is_live:
                    return entry.node_id
                found = entry.node_id
        return found

    def _answered(self) -> None:
        self._answered_since_heard += 1
        if self.unreachable_here and self._throttle.allow("unreachable here") is not None:
            _, port = split_host_port(self.local.address)
            log.warning(
                "peers take this node's messages but none of theirs arrive: they cannot reach "
                "its advertised address %s. Set --advertise host:port to an address they reach "
                "and let TCP port %d through the firewall",
                self.local.address,
                port,
            )

    def _check_observed(self, bootstrap: str, observed: str | None) -> None:
        """The join answer says where the bootstrap peer saw this node connect from."""
        seen = observed_host(observed)
        mine, _ = split_host_port(self.local.address)
        advertised = observed_host(mine)  # None for a name: names are not checked here
        if seen is None or advertised is None or seen == advertised:
            return
        if self._throttle.allow(f"observed {seen}") is not None:
            log.warning(
                "the bootstrap peer %s sees this node connect from %s, but it advertises %s: "
                "if peers cannot reach %s, set --advertise",
                bootstrap,
                seen,
                self.local.address,
                mine,
            )

    def _log_changes(self, before: MembershipView, node_ids: set[NodeId]) -> None:
        """One INFO line per member whose state changed, and one when this node joins."""
        after = self.view
        for node_id in sorted(node_ids - {self.local.node_id}):
            old, new = before.get(node_id), after.get(node_id)
            if new is None or new.record is None:
                continue
            was = old.state if old is not None and old.record is not None else None
            if was is new.state:
                continue
            address = new.record.address
            if was is None and new.state is MemberState.ALIVE:
                log.info("member %s joined at %s", node_id, address)
            elif new.state is MemberState.ALIVE:
                log.info("member %s at %s is alive again", node_id, address)
            elif new.state is MemberState.LEFT:
                log.info("member %s at %s left", node_id, address)
            else:
                log.warning("member %s at %s is %s", node_id, address, new.state.value)
        others = len([n for n in after.live_ids if n != self.local.node_id])
        if not self._joined and others:
            self._joined = True
            log.info("joined the swarm: %d other member(s) alive", others)

    async def _close(self) -> None:
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        if self._http is not None:
            await self._http.close()


def seal_key_probe(codec: FrameCodec, receiver: NodeId | None) -> bytes:
    """A gossip frame that changes nothing where it opens (KEY_PROBE_TARGET): POSTed to a
    node's GOSSIP_PATH, 204 says the node takes frames sealed with `codec`'s key and clock,
    400 with REFUSAL_HEADER says why not."""
    kind, fields = message_to_wire(Ping(codec.sender, "-", 0, KEY_PROBE_TARGET))
    return codec.encode(GossipFrame(kind, fields), receiver)


def _why_lost(error: BaseException) -> str:
    """A failed send's cause in a few words ("connection refused"), not aiohttp's sentence."""
    cause = getattr(error, "os_error", error)
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno).lower()
    if isinstance(error, TimeoutError):
        return f"no answer within {_SEND_TIMEOUT_S:.0f} s"
    return str(error) or type(error).__name__
