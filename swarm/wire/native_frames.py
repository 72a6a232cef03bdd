"""A decode step's frame sealed and opened by one C call each (`swarm/wire/frames/`, built
where a compiler is): the same bytes as `seal_frame` writes with an uncompressed body, and
the same message as `open_frame` and `from_wire` read from them. A frame's Python costs a hop
most where it runs cold, after the hop's layers have streamed through the caches
(docs/benchmarks.md: 0.25-0.42 ms a hop for the Python codec against 0.08-0.09 for the
bytes). Without the module, or for anything the C side does not cover (another message, a
compressed body, a quantized tensor, a field out of the encoder's order, a bad tag), `seal`
and `open` answer None and the caller takes the Python path; every error still comes from
there."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import torch

from swarm.errors import FrameError
from swarm.schema import HopTimes
from swarm.types import Hop, NodeId, SessionId
from swarm.wire.codec import TORCH_DTYPES, Codec
from swarm.wire.fields import Fields
from swarm.wire.frame import unpack_limited
from swarm.wire.limits import WireLimits
from swarm.wire.memo import IdentityMemo
from swarm.wire.messages import (
    MessageType,
    Peer,
    ResultMessage,
    StepMessage,
    hop_to_wire,
    read_route,
)

_frames: ModuleType | None
try:
    from swarm.wire import _frames  # type: ignore[attr-defined,no-redef]
except ImportError:  # not built: the Python path seals every frame
    _frames = None

_KEPT = 256  # packed routes and entries kept per sealer, routes and entries per opener
_STEP, _RESULT = 3, 4  # the message types the C side knows (its STEP_TYPE and RESULT_TYPE)
_VALUES = {"float32": np.float32, "float16": np.float16}  # the tensors it opens


def available() -> bool:
    """Whether the C module was built and loads."""
    return _frames is not None and (MessageType.STEP, MessageType.RESULT) == (_STEP, _RESULT)


def opens_within(limits: WireLimits) -> bool:
    """Whether what the C side opens passes these limits wherever the Python path's would:
    one tensor of rank 3, float32 or float16 (the rest it checks against them itself)."""
    return (
        limits.max_tensors >= 1 and limits.max_rank >= 3 and set(_VALUES) <= limits.allowed_dtypes
    )


class StepSealer:
    """Seals step and result frames for one sender under one key."""

    def __init__(self, key: bytes, sender: str) -> None:
        if _frames is None:
            raise RuntimeError("swarm.wire._frames is not built")
        self._frames = _frames
        self._key = _frames.key(key)
        self._sender = sender.encode()
        # a session's steps carry the same route and entry objects (hop.onward keeps the
        # same onward route for the same route)
        self._routes: IdentityMemo[tuple[Hop, ...], bytes] = IdentityMemo(_KEPT)
        self._entries: IdentityMemo[Peer, bytes] = IdentityMemo(_KEPT)

    def seal(self, message: StepMessage | ResultMessage, counter: int, receiver: str) -> Any:
        """The frame, or None where the Python path must seal it (and raise what it raises)."""
        if message.codec is not Codec.RAW:
            return None
        try:  # one torch call: each costs ~10 us where it runs cold, after a hop's layers
            values = message.hidden.numpy()
        except (TypeError, RuntimeError):  # bfloat16, a tensor that needs grad or on a GPU
            return None
        route: bytes | None = None
        entry: bytes | None = None
        if isinstance(message, StepMessage):
            if not message.route or message.prefix or message.block or message.every_row:
                # fields it has not
                return None
            try:
                route = self._routes.get(message.route, _route_bytes)
                entry = self._entries.get(message.entry, _entry_bytes)
            except (TypeError, ValueError, OverflowError):
                return None
        return self._frames.seal_step(
            self._key,
            int(message.TYPE),
            self._sender,
            receiver.encode(),
            counter,
            message.session,
            message.step,
            message.position,
            route,
            entry,
            message.timings,
            message.verify,
            values,
        )


_Shape = tuple[str, tuple[int, ...]]  # a tensor's dtype name and shape


class SpareTensor:
    """A fresh tensor made ahead for the next step frame one thread opens, in the dtype and
    shape of the last one. `torch.from_numpy` where a frame is opened costs a hop ~40 us
    where it runs cold, after its layers have streamed through the caches; made while the
    thread has sent its frames on and waits, it costs ~3. Each spare is claimed by one
    message at most and never written again: a message's tensor is its own, as ever.

    One thread's own (the compute thread's fast links): `buffer` and `claim` on opening a
    frame, `refill` once the frames it brought have gone on."""

    def __init__(self) -> None:
        self._ready: tuple[_Shape, torch.Tensor, np.ndarray] | None = None
        self._wanted: _Shape | None = None

    def buffer(self) -> np.ndarray | None:
        """Where the next frame's values may be copied."""
        return None if self._ready is None else self._ready[2]

    def claim(self, values: object, dtype: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        """The spare, where the frame's values were copied into it and it has their dtype and
        shape (a spare filled in another shape is given up too: `values` then holds it)."""
        self._wanted = (dtype, shape)
        ready = self._ready
        if ready is None or values is not ready[2]:
            return None
        self._ready = None
        return ready[1] if ready[0] == self._wanted else None

    def refill(self) -> None:
        """Make the next spare, in the dtype and shape of the last frame opened."""
        if self._ready is None and self._wanted is not None:
            dtype, shape = self._wanted
            tensor = torch.empty(shape, dtype=TORCH_DTYPES[dtype])
            self._ready = (self._wanted, tensor, tensor.numpy())


@dataclass(frozen=True)
class Opened:
    """A frame the C side opened: tag checked, not yet its receiver, clock or replay."""

    sender: str
    receiver: str
    counter: int
    message: StepMessage | ResultMessage


class StepOpener:
    """Opens step and result frames under one key, within `limits`."""

    def __init__(self, key: bytes, limits: WireLimits) -> None:
        if _frames is None or not opens_within(limits):
            raise RuntimeError("swarm.wire._frames is not built, or cannot open within limits")
        self._frames = _frames
        self._key = _frames.key(key)
        self._limits = limits
        self._caps = (
            limits.max_frame_bytes,
            limits.max_header_bytes,
            limits.max_body_bytes,
            limits.max_str_len,
            limits.max_array_len,
            limits.max_map_len,
            limits.max_tensor_elements,
        )
        self._routes: dict[bytes, tuple[Hop, ...]] = {}
        self._entries: dict[tuple[str, str], Peer] = {}

    def open(self, data: Any, spare: SpareTensor | None = None) -> Opened | None:
        """The frame's message, or None where the Python path must open it; its tensor is
        `spare`'s where that one fits."""
        into = None if spare is None else spare.buffer()
        parts = self._frames.open_step(data, self._key, *self._caps, into)
        if parts is None:
            return None
        (kind, sender, receiver, counter, session, step, position, verify) = parts[:8]
        (route_bytes, entry_id, entry_address, timings, dtype, shape, values) = parts[8:]
        hidden = None if spare is None else spare.claim(values, dtype, shape)
        if hidden is None:
            hidden = torch.from_numpy(np.frombuffer(values, _VALUES[dtype]).reshape(shape))
        times = tuple(HopTimes(*timing) for timing in timings)
        message: StepMessage | ResultMessage
        if kind == _STEP:
            route = self._route(route_bytes)
            if route is None:
                return None
            entry = self._entry(entry_id, entry_address)
            message = StepMessage(
                SessionId(session), step, position, hidden, route, entry, times, Codec.RAW, verify
            )
        else:
            message = ResultMessage(
                SessionId(session), step, position, hidden, times, Codec.RAW, verify
            )
        return Opened(sender, receiver, counter, message)

    def _route(self, packed: bytes) -> tuple[Hop, ...] | None:
        """The route in these bytes, read the Python way once (None: it is not a route the
        Python path would read, which then says why)."""
        route = self._routes.get(packed)
        if route is not None:
            return route
        try:
            raw = unpack_limited(packed, self._limits)
            route = read_route(Fields({"route": raw}, "header.m"))
        except FrameError:
            return None
        if len(self._routes) >= _KEPT:
            self._routes.clear()
        self._routes[packed] = route
        return route

    def _entry(self, node: str, address: str) -> Peer:
        entry = self._entries.get((node, address))
        if entry is None:
            if len(self._entries) >= _KEPT:
                self._entries.clear()
            entry = self._entries[(node, address)] = Peer(NodeId(node), address)
        return entry


def _route_bytes(route: tuple[Hop, ...]) -> bytes:
    return msgpack.packb([hop_to_wire(hop) for hop in route], use_bin_type=True)  # type: ignore[no-any-return]


def _entry_bytes(entry: Peer) -> bytes:
    return msgpack.packb(entry.to_wire(), use_bin_type=True)  # type: ignore[no-any-return]
