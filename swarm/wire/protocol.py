"""Messages <-> authenticated frames, for one node and one purpose (frames or gossip)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from swarm.errors import FrameError
from swarm.types import NodeId
from swarm.wire.auth import BytesLike, MessageCounter, ReplayWindow
from swarm.wire.frame import open_frame, seal_frame
from swarm.wire.limits import WireLimits
from swarm.wire.messages import MESSAGE_CLASSES, Message


@dataclass(frozen=True)
class Received:
    sender: NodeId  # authenticated: only a holder of the key could have sent it
    counter: int
    message: Message


class FrameCodec:
    """Encodes this node's messages and decodes its peers' under one key. Share one instance
    across all of a node's links of that purpose: the replay window must see every frame.
    `decode` raises FrameError and nothing else; the caller closes the link that sent it."""

    def __init__(
        self,
        key: bytes,
        sender: NodeId,
        limits: WireLimits | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.sender = sender
        self.limits = limits or WireLimits()
        self._key = key
        self._counter = MessageCounter(clock_ns)
        self._replay = ReplayWindow(self.limits.replay_window, self.limits.max_senders)

    def encode(self, message: Message, *, compress: bool = True) -> bytes:
        fields, tensors = message.to_wire()
        frame = seal_frame(
            self._key,
            self.sender,
            self._counter.next(),
            message.TYPE,
            fields,
            tensors,
            compress=compress,
        )
        if len(frame) > self.limits.max_frame_bytes:
            raise FrameError(
                f"frame of {len(frame)} bytes is over the limit of {self.limits.max_frame_bytes}"
            )
        return frame

    def decode(self, data: BytesLike) -> Received:
        opened = open_frame(data, self._key, self.limits, self._replay)
        cls = MESSAGE_CLASSES.get(opened.type)
        if cls is None:
            raise FrameError(f"unknown message type {opened.type}")
        return Received(
            NodeId(opened.sender), opened.counter, cls.from_wire(opened.fields, opened.tensors)
        )
