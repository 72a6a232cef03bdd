"""SWIM protocol messages between nodes, as plain frozen dataclasses.

Every message names its sender and the address to answer on, and carries piggybacked
updates. The wire layer gives these `to_wire`/`from_wire`; the protocol never sees bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.membership.updates import Update
from swarm.types import NodeId


@dataclass(frozen=True)
class Ping:
    """A direct probe. `target` lets a node ignore a probe meant for a previous owner of its
    address."""

    sender: NodeId
    reply_to: str  # address of the sender
    seq: int
    target: NodeId
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class PingReq:
    """Ask the receiver to probe `target` and forward the answer (an indirect probe)."""

    sender: NodeId
    reply_to: str
    seq: int  # the requester's probe sequence number, echoed in the forwarded ack
    target: NodeId
    target_address: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Ack:
    """The answer to a ping, or an answer forwarded for a ping-req, under the asker's seq."""

    sender: NodeId
    reply_to: str
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class Gossip:
    """Piggybacked updates on their own, sent to a few random peers every gossip interval."""

    sender: NodeId
    reply_to: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True)
class PushPull:
    """A full state exchange: the receiver merges `state` and, unless this is the reply,
    answers with its own. `join` marks the first exchange of a joining node."""

    sender: NodeId
    reply_to: str
    state: tuple[Update, ...]
    reply: bool = False
    join: bool = False


Message = Ping | PingReq | Ack | Gossip | PushPull


@dataclass(frozen=True)
class Send:
    """One message for the transport to deliver to `address`; losing it is allowed."""

    address: str
    message: Message
