"""The transfer envelope: one POST per request, authenticated like every other peer message.

A request is a small msgpack map followed by an HMAC tag under a key derived from the swarm's
frame key; it names its sender and its receiver (a node id: a request sealed for one node is
refused by every other) and carries a counter, microseconds of the sender's clock, that the
receiver checks against its own clock and its replay window, as for frames. A sender learns a
peer's id from its first request: a request that names no receiver, or another, is answered
421 with the receiver's id in the `NODE_HEADER` header (`swarm.wire`) (ids are no secret). A reply
is `u32 header length | msgpack header | payload | tag`, and its header echoes the request's
counter, so a reply cannot be replayed as the answer to another request. Chunks travel as
raw payload bytes: weights do not compress, and they are not tensors the frame codec knows."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack

from swarm.errors import FrameError
from swarm.types import NodeId
from swarm.wire.auth import TAG_BYTES, MessageCounter, compute_tag, verify_tag
from swarm.wire.frame import Recipient, check_clock
from swarm.wire.limits import WireLimits
from swarm.wire.protocol import first_counter_us

TRANSFER_PATH = "/transfer"
MAX_REQUEST_BYTES = 4096  # a request names a model, a part and a chunk: nothing more
MAX_INDEX_BYTES = 64 * 1024 * 1024  # manifest, config and tokenizer of one model
MAX_NODE_ID_BYTES = 255
_LENGTH = struct.Struct("<I")


class Ask(Enum):
    INDEX = "index"  # the model's manifest, config and tokenizer, and who else serves it
    DIGEST = "digest"  # whether the peer holds a part, and what it hashes to
    CHUNK = "chunk"  # one chunk of a part file


@dataclass(frozen=True)
class Request:
    ask: Ask
    model: str  # a model id, or (asking for the index) any name the model answers to
    part: str = ""
    chunk: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"ask": self.ask.value, "model": self.model, "part": self.part, "chunk": self.chunk}

    @classmethod
    def from_wire(cls, raw: Any) -> Request:
        try:
            return cls(Ask(raw["ask"]), str(raw["model"]), str(raw["part"]), int(raw["chunk"]))
        except (KeyError, TypeError, ValueError) as e:
            raise FrameError(f"malformed transfer request: {e}") from None


@dataclass(frozen=True)
class Reply:
    fields: dict[str, Any]  # "error": why a request was refused, when it was
    payload: bytes = field(default=b"", repr=False)

    @property
    def error(self) -> str | None:
        error = self.fields.get("error")
        return None if error is None else str(error)


@dataclass(frozen=True)
class OpenedRequest:
    """A request whose tag and time passed; the receiver and replay checks are the server's."""

    sender: NodeId
    receiver: str  # the node id it was sealed for; "" when the sender did not know it yet
    counter: int
    request: Request


class TransferCodec:
    """Seals and opens transfer messages under this node's id and the swarm's key."""

    def __init__(
        self,
        frame_key: bytes,
        me: NodeId,
        limits: WireLimits | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        *,
        restarts: bool = False,
    ) -> None:
        """`restarts`: a node's codec, which may have run before (`first_counter_us`)."""
        # a key of its own: a transfer message is never a valid frame or gossip message
        self._key = compute_tag(frame_key, b"swarm transfer")
        self.me = me
        self._limits = limits or WireLimits()
        self._clock_ns = clock_ns
        self._started_us = first_counter_us(self._limits, clock_ns, restarts)
        self._counter = MessageCounter(clock_ns)

    def seal_request(self, request: Request, receiver: NodeId | None) -> tuple[int, bytes]:
        """`receiver`: the id of the node it goes to, None while the sender does not know it
        (the node then answers 421 with its id)."""
        counter = self._counter.next()
        fields = {"from": self.me, "to": receiver or "", "n": counter, **request.to_wire()}
        body = msgpack.packb(fields)
        return counter, body + compute_tag(self._key, body)

    def open_request(self, data: bytes) -> OpenedRequest:
        """The request in `data`; FrameError when its tag or its time does not pass."""
        body = self._verified(data)
        raw = _unpack(body, max_bin=0)
        if not isinstance(raw, dict) or not isinstance(raw.get("from"), str):
            raise FrameError("malformed transfer request")
        counter, receiver = raw.get("n"), raw.get("to", "")
        if not isinstance(counter, int) or not isinstance(receiver, str):
            raise FrameError("a transfer request without a counter or a receiver")
        now_us = self._clock_ns() // 1000
        check_clock(Recipient(self.me, False, now_us, self._started_us), self._limits, counter)
        return OpenedRequest(NodeId(raw["from"]), receiver, counter, Request.from_wire(raw))

    def seal_reply(self, counter: int, reply: Reply) -> bytes:
        header = msgpack.packb({"n": counter, **reply.fields}, use_bin_type=True)
        body = b"".join([_LENGTH.pack(len(header)), header, reply.payload])
        return body + compute_tag(self._key, body)

    def open_reply(self, data: bytes, counter: int) -> Reply:
        body = self._verified(data)
        if len(body) < _LENGTH.size:
            raise FrameError("a transfer reply too short for its header")
        (length,) = _LENGTH.unpack_from(body)
        if _LENGTH.size + length > len(body):
            raise FrameError("a transfer reply's header runs past its end")
        fields = _unpack(body[_LENGTH.size : _LENGTH.size + length], max_bin=MAX_INDEX_BYTES)
        if not isinstance(fields, dict) or fields.pop("n", None) != counter:
            raise FrameError("a transfer reply that does not answer this request")
        return Reply(fields, body[_LENGTH.size + length :])

    def _verified(self, data: bytes) -> bytes:
        if len(data) < TAG_BYTES:
            raise FrameError("a transfer message too short for its tag")
        body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
        verify_tag(self._key, body, tag)
        return body


def _unpack(data: bytes, max_bin: int) -> Any:
    try:
        return msgpack.unpackb(
            data, raw=False, max_bin_len=max_bin, max_str_len=1 << 16, max_map_len=1 << 12
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FrameError(f"undecodable transfer message: {e}") from None
