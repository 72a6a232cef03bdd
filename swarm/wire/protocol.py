"""Messages <-> authenticated frames, for one node and one purpose (frames or gossip)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from swarm.errors import FrameError
from swarm.types import NodeId
from swarm.wire import native_frames
from swarm.wire.auth import BytesLike, MessageCounter, ReplayWindow
from swarm.wire.frame import Recipient, check_recipient, is_compressed, open_frame, seal_frame
from swarm.wire.limits import WireLimits
from swarm.wire.lz4_odds import Lz4Odds
from swarm.wire.messages import MESSAGE_CLASSES, Message, ResultMessage, StepMessage
from swarm.wire.native_frames import StepOpener, StepSealer

# a 421's header: the node id a request or frame to this node must name (ids are no secret)
NODE_HEADER = "X-Swarm-Node"
# A frame sealed this long before a codec that never ran before was made still passes: a
# peer's clock may run a little behind.
STARTUP_GRACE_US = 1_000_000


def first_counter_us(limits: WireLimits, clock_ns: Callable[[], int], restarts: bool) -> int:
    """The lowest counter a codec made now takes. A node's codecs (`restarts`) take none up
    to `limits.clock_ahead_us` past now: the node's previous run, which stopped before now,
    may have taken frames sealed up to that far ahead of its clock, and would otherwise take
    them again. (Exact while the node's own clock does not step back across the restart.)
    Others take frames sealed up to STARTUP_GRACE_US before now."""
    now_us = clock_ns() // 1000
    return now_us + limits.clock_ahead_us if restarts else now_us - STARTUP_GRACE_US


_NATIVE = (StepMessage, ResultMessage)  # the messages native_frames seals
_OPENED_NATIVELY = (None, StepMessage, ResultMessage)  # what decode may `expect` of them


def shifted_clock_ns(offset_s: float) -> Callable[[], int]:
    """The wall clock in nanoseconds, `offset_s` ahead (net.test_clock_offset_s: tests only)."""
    if not offset_s:
        return time.time_ns
    offset_ns = round(offset_s * 1e9)
    return lambda: time.time_ns() + offset_ns


@dataclass(frozen=True)
class Received:
    sender: NodeId  # authenticated: only a holder of the key could have sent it
    counter: int
    message: Message


class FrameCodec:
    """Encodes this node's messages and decodes its peers' under one key. Share one instance
    across all of a node's links of that purpose: the replay window must see every frame.
    `decode` raises FrameError and nothing else; the caller closes the link that sent it.

    Frames are addressed: `encode` names the receiver, and `decode` refuses frames addressed
    to another node, and unaddressed ones unless `accept_unaddressed` (gossip, whose first
    message to a bootstrap address cannot know the id behind it). It also refuses counters
    more than `limits.clock_window_us` behind this node's clock or `limits.clock_ahead_us`
    ahead of it, or below `first_counter_us` (a frame captured before the node restarted).
    Bodies go lz4-compressed where that pays; a message type whose bodies stopped paying
    tries now and then (lz4_odds.py)."""

    def __init__(
        self,
        key: bytes,
        sender: NodeId,
        limits: WireLimits | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        *,
        accept_unaddressed: bool = False,
        native: bool = True,
        restarts: bool = False,
    ) -> None:
        """`native`: step and result frames sealed and opened by one C call each where it
        was built (native_frames.py): the same bytes and messages as the Python path.
        `restarts`: a node's codec, which may have run before (`first_counter_us`)."""
        self.sender = sender
        self.limits = limits or WireLimits()
        self._key = key
        self._clock_ns = clock_ns
        self._started_us = first_counter_us(self.limits, clock_ns, restarts)
        self._accept_unaddressed = accept_unaddressed
        self._counter = MessageCounter(clock_ns)
        self._replay = ReplayWindow(self.limits.replay_window, self.limits.max_senders)
        self._skew = ClockSkew(self.limits.max_senders)
        self._lz4 = Lz4Odds()  # which message types' bodies are worth compressing
        native = native and native_frames.available()
        self._sealer = StepSealer(key, sender) if native else None
        opens = native and native_frames.opens_within(self.limits)
        self._opener = StepOpener(key, self.limits) if opens else None

    def encode(
        self, message: Message, receiver: NodeId | None = None, *, compress: bool = True
    ) -> bytes:
        trying = compress and self._lz4.try_next(message.TYPE)
        if self._sealer is not None and not trying and type(message) in _NATIVE:
            sealed = self._sealer.seal(
                cast(StepMessage | ResultMessage, message), self._counter.next(), receiver or ""
            )
            if sealed is not None:
                return self._within_limit(sealed)
        fields, tensors = message.to_wire()
        frame = seal_frame(
            self._key,
            self.sender,
            self._counter.next(),
            message.TYPE,
            fields,
            tensors,
            compress=trying,
            receiver=receiver or "",
        )
        if trying:
            self._lz4.tried(message.TYPE, is_compressed(frame))
        return self._within_limit(frame)

    def _within_limit(self, frame: bytes) -> bytes:
        if len(frame) > self.limits.max_frame_bytes:
            raise FrameError(
                f"frame of {len(frame)} bytes is over the limit of {self.limits.max_frame_bytes}"
            )
        return frame

    def decode(
        self,
        data: BytesLike,
        expect: type[Message] | None = None,
        *,
        spare: native_frames.SpareTensor | None = None,
    ) -> Received:
        """The message in `data`; with `expect`, a frame of another type is refused before
        its tensors are decoded. `spare`: the calling thread's tensor made ahead, which a step
        or result frame's hidden states may take."""
        now_us = self._clock_ns() // 1000
        recipient = Recipient(self.sender, self._accept_unaddressed, now_us, self._started_us)
        if self._opener is not None and expect in _OPENED_NATIVELY:
            native = self._opener.open(data, spare)
            if native is not None and (expect is None or type(native.message) is expect):
                # the checks open_frame makes after the tag, in its order
                check_recipient(recipient, self.limits, native.receiver, native.counter)
                self._replay.accept(native.sender, native.counter)
                self._skew.observe(native.sender, now_us - native.counter)
                return Received(NodeId(native.sender), native.counter, native.message)
        opened = open_frame(data, self._key, self.limits, self._replay, recipient)
        cls = MESSAGE_CLASSES.get(opened.type)
        if cls is None:
            raise FrameError(f"unknown message type {opened.type}")
        if expect is not None and cls is not expect:
            raise FrameError(f"a {cls.__name__} where a {expect.__name__} belongs")
        self._skew.observe(opened.sender, now_us - opened.counter)
        try:
            message = cls.from_wire(opened.fields, opened.tensors)
        except FrameError:
            raise
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, RuntimeError) as e:
            # a key holder's bug the checks above missed: still only this link's trouble
            raise FrameError(f"malformed {cls.__name__}: {type(e).__name__}: {e}") from None
        return Received(NodeId(opened.sender), opened.counter, message)

    def now_unix(self) -> float:
        """The clock frames are sealed and checked with, in unix seconds."""
        return self._clock_ns() / 1e9

    def takes_in_s(self) -> float:
        """Seconds until this codec takes frames sealed now (0 once it does): a node's refuses
        those sealed up to `limits.clock_ahead_us` past its making (`first_counter_us`)."""
        return max(0.0, (self._started_us - self._clock_ns() // 1000) / 1e6)

    def clock_skew_ms(self) -> dict[str, float]:
        """Per sender: this node's clock minus the sender's, in ms, transit included."""
        return self._skew.snapshot()


class ClockSkew:
    """The smallest recent (receiver clock - sender counter) per sender: the skew of its clock
    plus the shortest transit, refreshed so that a stepped clock shows within a minute."""

    def __init__(self, max_senders: int, keep: int = 64) -> None:
        self._max_senders = max_senders
        self._keep = keep  # observations before the minimum starts over
        self._seen: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # min, last, count
        self._lock = threading.Lock()

    def observe(self, sender: str, apart_us: int) -> None:
        with self._lock:
            low, _, count = self._seen.get(sender, (apart_us, apart_us, 0))
            if count >= self._keep:
                low, count = apart_us, 0
            self._seen[sender] = (min(low, apart_us), apart_us, count + 1)
            self._seen.move_to_end(sender)
            if len(self._seen) > self._max_senders:
                self._seen.popitem(last=False)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {s: round(low / 1000, 3) for s, (low, _, _) in sorted(self._seen.items())}
