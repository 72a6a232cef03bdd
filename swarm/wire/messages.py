"""Domain messages of the inference path and their conversion at the edge of the wire.

Each message has `to_wire() -> (fields, tensors)` and `from_wire(fields, tensors)`. Field names
on the wire are short and stable; a field a reader does not know is ignored, and an optional
field a sender omits takes its default, so nodes of neighbouring versions can mix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

import torch

from swarm.errors import FrameError, SpanError
from swarm.schema import HopTimes
from swarm.types import Hop, LayerSpan, NodeId, SessionId
from swarm.wire.codec import Codec, EncodedTensor, decode_tensor, encode_tensor
from swarm.wire.fields import Fields

WireFields = dict[str, Any]
WirePayload = tuple[WireFields, tuple[EncodedTensor, ...]]


class MessageType(IntEnum):
    """Append only: the numbers are on the wire. Retired numbers are never reused: 1 opened a
    session along a route (sessions open with their first step), 9 set a simulated slowdown."""

    CLOSE = 2
    STEP = 3
    RESULT = 4
    ERROR = 5
    GOSSIP = 6
    PROBE = 7
    PROBE_REPLY = 8
    HELLO = 10  # opens a link: proves the key in its upgrade request (swarm/net/hello.py)
    RELOAD = 11  # an entry's spot-check convicted the receiver: reload your layers


class ErrorCode(IntEnum):
    """Why a hop failed a step. Append only; a code this version does not know reads as
    UNKNOWN. Retired, never reused: 7 (wrong model), 9 (timeout), 10 (overloaded)."""

    UNKNOWN = 0
    INTERNAL = 1
    BAD_FRAME = 2
    SESSION_NOT_FOUND = 3
    POSITION_MISMATCH = 4
    KV_CACHE_FULL = 5
    WRONG_SPAN = 6  # the hop does not serve the span the route asks of it
    HOP_UNREACHABLE = 8  # the next hop could not be reached
    LEAVING = 11  # the hop is leaving the swarm: it takes no new sessions, then no steps
    PREFIX_MISSING = 12  # the hop no longer keeps the prompt blocks the step starts from


@dataclass(frozen=True)
class Peer:
    node_id: NodeId
    address: str  # host:port of its node-to-node endpoint

    def to_wire(self) -> WireFields:
        return {"id": self.node_id, "addr": self.address}

    @classmethod
    def from_wire(cls, f: Fields) -> Peer:
        return cls(NodeId(f.get_str("id")), f.get_str("addr"))


def hop_to_wire(hop: Hop) -> WireFields:
    """A route's hop (`swarm.types.Hop`, which routing finds) as a step's frame carries it."""
    return {"id": hop.node_id, "addr": hop.address, "start": hop.span.start, "end": hop.span.end}


def hop_from_wire(f: Fields) -> Hop:
    try:
        span = LayerSpan(f.get_int("start"), f.get_int("end"))
    except SpanError as exc:
        raise FrameError(f"route hop: {exc}") from None
    return Hop(NodeId(f.get_str("id")), f.get_str("addr"), span)


@dataclass(frozen=True)
class CloseSession:
    """Frees a session's KV caches on the receiving hop; the entry sends one to each hop."""

    TYPE: ClassVar[MessageType] = MessageType.CLOSE
    session: SessionId

    def to_wire(self) -> WirePayload:
        return {"session": self.session}, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> CloseSession:
        _no_tensors(tensors, "close")
        return cls(SessionId(f.get_str("session")))


@dataclass(frozen=True)
class StepMessage:
    """Hidden states on their way through the route. The receiver is `route[0]`: it runs its
    span and sends the rest of the route on, or, when it is the last hop, a ResultMessage to
    `entry`. `hidden` does not take part in ==."""

    TYPE: ClassVar[MessageType] = MessageType.STEP
    session: SessionId
    step: int  # the entry's step number: 0 is the prefill, then one per token
    position: int  # the session position of hidden's first row
    hidden: torch.Tensor = field(compare=False)  # [1, seq, hidden_size]
    route: tuple[Hop, ...]  # hops still to run, the receiver first; never empty
    entry: Peer  # where the last hop sends its ResultMessage
    timings: tuple[HopTimes, ...] = ()  # one per hop run so far
    codec: Codec = Codec.RAW  # how hidden travels; on receipt, how it travelled
    # a verify step: every position runs as its own decode step would, and the last hop
    # returns them all (not only the last); "verify" on the wire, only when set
    verify: bool = False
    # a session's first step that starts past position 0: the digests of the kept prompt
    # blocks (swarm.runtime.prefix_blocks) each hop starts the session from, in order;
    # "prefix" on the wire, only when set
    prefix: tuple[str, ...] = ()
    # a prefill chunk that is a whole block: the digest each hop keeps its positions under
    # once it has run them; "block" on the wire, only when set
    block: str = ""
    # a prefill chunk whose every position the last hop returns, not only the last (an
    # embedding pooled over them); "rows" on the wire, only when set
    every_row: bool = False

    def to_wire(self) -> WirePayload:
        if not self.route:
            raise FrameError("a step needs a route of at least one hop")
        fields: WireFields = {
            "session": self.session,
            "step": self.step,
            "pos": self.position,
            "route": [hop_to_wire(h) for h in self.route],
            "entry": self.entry.to_wire(),
            "timings": [_timing_fields(t) for t in self.timings],
        }
        if self.verify:
            fields["verify"] = True
        if self.prefix:
            fields["prefix"] = list(self.prefix)
        if self.block:
            fields["block"] = self.block
        if self.every_row:
            fields["rows"] = True
        return fields, (encode_tensor(self.hidden, self.codec),)

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> StepMessage:
        hidden, codec = _hidden(tensors, "step")
        return cls(
            SessionId(f.get_str("session")),
            f.get_int("step"),
            f.get_int("pos"),
            hidden,
            read_route(f),
            Peer.from_wire(f.get_fields("entry")),
            _timings(f),
            codec,
            f.get_bool("verify", False),
            _digests(f),
            _digest(f.get_str("block", "", allow_empty=True), "block"),
            f.get_bool("rows", False),
        )


DIGEST_CHARS = 32  # a prompt block's digest: 16 bytes of BLAKE2b, in hex


def _digests(f: Fields) -> tuple[str, ...]:
    return tuple(_digest(d, "prefix") for d in f.get_list("prefix", []))


def _digest(value: object, name: str) -> str:
    """A block digest as the entry writes it, or "" (none)."""
    if value == "" and name == "block":
        return ""
    if (
        not isinstance(value, str)
        or len(value) != DIGEST_CHARS
        or any(c not in "0123456789abcdef" for c in value)
    ):
        raise FrameError(f"step.{name} holds {value!r}, not a {DIGEST_CHARS}-digit hex digest")
    return value


@dataclass(frozen=True)
class ResultMessage:
    """The last hop's output for a step, sent back to the entry. `hidden` does not take part
    in ==."""

    TYPE: ClassVar[MessageType] = MessageType.RESULT
    session: SessionId
    step: int
    position: int  # the session position of hidden's first row
    hidden: torch.Tensor = field(compare=False)  # [1, seq, hidden_size], usually seq = 1
    timings: tuple[HopTimes, ...] = ()  # one per hop of the route
    codec: Codec = Codec.RAW
    # hidden holds every position of a verify step; a peer that does not know verify steps
    # returns the last position only, without it
    verify: bool = False

    def to_wire(self) -> WirePayload:
        fields: WireFields = {
            "session": self.session,
            "step": self.step,
            "pos": self.position,
            "timings": [_timing_fields(t) for t in self.timings],
        }
        if self.verify:
            fields["verify"] = True
        return fields, (encode_tensor(self.hidden, self.codec),)

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> ResultMessage:
        hidden, codec = _hidden(tensors, "result")
        return cls(
            SessionId(f.get_str("session")),
            f.get_int("step"),
            f.get_int("pos"),
            hidden,
            _timings(f),
            codec,
            f.get_bool("verify", False),
        )


@dataclass(frozen=True)
class ErrorMessage:
    """A hop could not run or forward a step; goes to the step's entry."""

    TYPE: ClassVar[MessageType] = MessageType.ERROR
    session: SessionId
    step: int
    code: ErrorCode
    reason: str  # for people: logs and the status page
    failed_hop: NodeId | None = None  # the hop that failed, when known
    # PREFIX_MISSING: how many of the step's kept blocks, from the first, the hop does hold
    held: int | None = None

    def to_wire(self) -> WirePayload:
        fields: WireFields = {
            "session": self.session,
            "step": self.step,
            "code": int(self.code),
            "reason": self.reason,
        }
        if self.failed_hop is not None:
            fields["hop"] = self.failed_hop
        if self.held is not None:
            fields["held"] = self.held
        return fields, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> ErrorMessage:
        _no_tensors(tensors, "error")
        code = f.get_int("code", 0)
        hop = f.get_optional_str("hop")
        return cls(
            SessionId(f.get_str("session")),
            f.get_int("step"),
            ErrorCode(code) if code in ErrorCode._value2member_map_ else ErrorCode.UNKNOWN,
            f.get_str("reason", "", allow_empty=True),
            None if hop is None else NodeId(hop),
            f.get_int("held") if f.has("held") else None,
        )


@dataclass(frozen=True)
class GossipFrame:
    """A membership message, converted by the membership layer: `fields` is a plain map on
    the way out and a `Fields` reader on the way in, so nothing above sees raw msgpack."""

    TYPE: ClassVar[MessageType] = MessageType.GOSSIP
    kind: str  # ping, pingreq, ack, gossip, pushpull
    fields: Any

    def to_wire(self) -> WirePayload:
        return {"kind": self.kind, "body": self.fields}, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> GossipFrame:
        _no_tensors(tensors, "gossip")
        return cls(f.get_str("kind"), f.get_fields("body"))


@dataclass(frozen=True)
class LinkProbe:
    """Measures a link: the receiver answers with a ProbeReply to `reply_to`. `padding` (random
    values, so lz4 cannot shrink them) makes the probe as big as an activation frame, so its
    round trip includes the time the link's bandwidth takes. It does not take part in ==."""

    TYPE: ClassVar[MessageType] = MessageType.PROBE
    seq: int
    reply_to: Peer
    padding: torch.Tensor = field(compare=False)  # [1, 1, n] float32

    def to_wire(self) -> WirePayload:
        fields = {"seq": self.seq, "reply": self.reply_to.to_wire()}
        return fields, (encode_tensor(self.padding, Codec.RAW),)

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> LinkProbe:
        padding, _ = _hidden(tensors, "probe")
        return cls(f.get_int("seq"), Peer.from_wire(f.get_fields("reply")), padding)


@dataclass(frozen=True)
class ProbeReply:
    """The answer to a LinkProbe; the frame's authenticated sender says who answered."""

    TYPE: ClassVar[MessageType] = MessageType.PROBE_REPLY
    seq: int

    def to_wire(self) -> WirePayload:
        return {"seq": self.seq}, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> ProbeReply:
        _no_tensors(tensors, "probe reply")
        return cls(f.get_int("seq"))


@dataclass(frozen=True)
class LinkHello:
    """What opens a link, in its upgrade request's headers: the receiver takes no frame from
    a link whose hello does not authenticate, and a link may be opened only to be watched."""

    TYPE: ClassVar[MessageType] = MessageType.HELLO

    def to_wire(self) -> WirePayload:
        return {}, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> LinkHello:
        _no_tensors(tensors, "hello")
        return cls()


@dataclass(frozen=True)
class ReloadLayers:
    """From an entry whose spot-check found the receiver's layers computing wrong bits (two
    routes without it agree against it): reload your span from your store, every part
    checked against its digest, into fresh blocks. `session` and `position` name the
    checked step, for the receiver's log."""

    TYPE: ClassVar[MessageType] = MessageType.RELOAD
    session: SessionId
    position: int

    def to_wire(self) -> WirePayload:
        return {"session": self.session, "pos": self.position}, ()

    @classmethod
    def from_wire(cls, f: Fields, tensors: Sequence[EncodedTensor]) -> ReloadLayers:
        _no_tensors(tensors, "reload")
        return cls(SessionId(f.get_str("session")), f.get_int("pos"))


Message = (
    CloseSession
    | StepMessage
    | ResultMessage
    | ErrorMessage
    | GossipFrame
    | LinkProbe
    | ProbeReply
    | LinkHello
    | ReloadLayers
)
MESSAGE_CLASSES: dict[int, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        CloseSession,
        StepMessage,
        ResultMessage,
        ErrorMessage,
        GossipFrame,
        LinkProbe,
        ProbeReply,
        LinkHello,
        ReloadLayers,
    )
}


# A session's decode steps carry the same route step after step: each is checked and built
# once and kept, so a hop does not rebuild its hops from their fields every step. A hop reads
# a frame after its interpreter went cold while the other hops computed, and there every
# Python call counts: decoding a step took ~0.45 ms at a hop against ~45 us in a loop.
_ROUTES_KEPT = 256
_routes_read: dict[tuple[Any, ...], tuple[Hop, ...]] = {}


def read_route(f: Fields) -> tuple[Hop, ...]:
    raw = f.get_list("route", [])
    key = _route_key(raw)
    if key is not None and (known := _routes_read.get(key)) is not None:
        return known
    route = tuple(hop_from_wire(h) for h in f.items("route", []))
    if not route:
        raise FrameError("the route is empty")
    for before, after in itertools.pairwise(route):
        if before.span.end != after.span.start:
            raise FrameError(f"route does not chain: {before.span} then {after.span}")
    if key is not None:
        _keep(_routes_read, key, route)
    return route


def _route_key(raw: list[Any]) -> tuple[Any, ...] | None:
    """What identifies a route's wire form: each hop's fields, where every hop is a map of
    plain values (None: read it the long way, whose errors name what is wrong)."""
    key = []
    for hop in raw:
        if type(hop) is not dict:
            return None
        node, address, start, end = hop.get("id"), hop.get("addr"), hop.get("start"), hop.get("end")
        if type(node) is not str or type(address) is not str:
            return None
        if type(start) is not int or type(end) is not int:
            return None
        key.append((node, address, start, end))
    return tuple(key)


def _keep(kept: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep `value`, the oldest kept going first past _ROUTES_KEPT (several threads may race
    here: a lost entry is read again)."""
    kept[key] = value
    while len(kept) > _ROUTES_KEPT:
        try:
            kept.pop(next(iter(kept)), None)
        except (RuntimeError, StopIteration):  # changed by the other thread meanwhile
            break


def _timing_fields(t: HopTimes) -> WireFields:
    return {
        "id": t.node,
        "q": t.queue,
        "c": t.compute,
        "w": t.wire,
        "d": t.dispatch,
        "r": t.resume,
        "s": t.send,
    }


def _timings(f: Fields) -> tuple[HopTimes, ...]:
    fast = []
    for raw in f.get_list("timings", []):
        timing = _timing(raw)
        if timing is None:
            break
        fast.append(timing)
    else:
        return tuple(fast)
    return tuple(
        HopTimes(
            NodeId(t.get_str("id")),
            t.get_float("q", 0.0),
            t.get_float("c", 0.0),
            t.get_float("w", 0.0),
            t.get_float("d", 0.0),
            t.get_float("r", 0.0),
            t.get_float("s", 0.0),
        )
        for t in f.items("timings", [])
    )


def _timing(raw: Any) -> HopTimes | None:
    """A timing as its hop wrote it (every part a finite float >= 0), or None: read it the
    long way, which names what is wrong or fills what is missing."""
    if type(raw) is not dict or type(node := raw.get("id")) is not str or not node:
        return None
    q, c, w, d, r, s = (
        raw.get("q"),
        raw.get("c"),
        raw.get("w"),
        raw.get("d"),
        raw.get("r"),
        raw.get("s"),
    )
    for part in (q, c, w, d, r, s):
        if type(part) is not float or not 0.0 <= part < math.inf:
            return None
    return HopTimes(NodeId(node), q, c, w, d, r, s)  # type: ignore[arg-type]  # floats, checked


def _no_tensors(tensors: Sequence[EncodedTensor], what: str) -> None:
    if tensors:
        raise FrameError(f"{what} messages carry no tensors, got {len(tensors)}")


def _hidden(tensors: Sequence[EncodedTensor], what: str) -> tuple[torch.Tensor, Codec]:
    if len(tensors) != 1:
        raise FrameError(f"{what} messages carry one tensor, got {len(tensors)}")
    encoded = tensors[0]
    shape = encoded.shape
    if len(shape) != 3 or shape[0] != 1 or shape[1] < 1:
        raise FrameError(f"{what} hidden states must be [1, seq>=1, hidden], not {list(shape)}")
    return decode_tensor(encoded), encoded.codec
