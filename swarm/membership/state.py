"""The state of one node's SWIM protocol: plain frozen dataclasses (see `protocol`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from swarm.config import MembershipConfig
from swarm.membership.broadcast import BroadcastQueue, SizeOf, estimated_size
from swarm.membership.messages import Send
from swarm.membership.rejoin import Remembered
from swarm.membership.updates import Update
from swarm.membership.view import MembershipView
from swarm.types import MemberRecord, NodeId

_PUSH_PULL_SCALE_THRESHOLD = 32  # members; memberlist stretches push-pull above this


@dataclass(frozen=True)
class ProtocolLimits:
    """Knobs memberlist has that MembershipConfig does not (yet)."""

    retransmit_mult: int = 4  # each update is sent this x ceil(log10(n+1)) times
    max_piggyback: int = 16  # updates per message
    max_piggyback_bytes: int = 8 * 1024  # estimated bytes of updates per message
    gossip_to_dead_s: float = 30.0  # seconds a dead member still gets gossip, to refute
    size_of: SizeOf = estimated_size


@dataclass(frozen=True)
class Probe:
    target: NodeId
    address: str
    seq: int
    indirect_at: float  # no ack by then: ask others
    deadline: float  # no ack by then: suspect
    indirect_sent: bool = False


@dataclass(frozen=True)
class Relay:
    """A ping sent for another node's ping-req; its ack is forwarded under their seq."""

    seq: int
    requester: str
    requester_seq: int
    expires: float


@dataclass(frozen=True)
class NodeState:
    config: MembershipConfig
    limits: ProtocolLimits
    local: MemberRecord
    view: MembershipView
    queue: BroadcastQueue = field(default_factory=BroadcastQueue)
    probe: Probe | None = None
    relays: tuple[Relay, ...] = ()
    order: tuple[NodeId, ...] = ()  # members still to probe in this round
    next_probe_at: float = 0.0
    next_gossip_at: float = 0.0
    next_push_pull_at: float = 0.0
    seq: int = 0
    leaving: bool = False
    seeds: tuple[str, ...] = ()  # bootstrap addresses, asked again while alone
    remembered: Remembered = field(default_factory=Remembered)  # addresses to heal through

    @property
    def node_id(self) -> NodeId:
        return self.local.node_id


NODE_FIELDS = frozenset(f.name for f in fields(NodeState))


@dataclass(frozen=True)
class Step:
    node: NodeState
    sends: tuple[Send, ...] = ()
    changes: tuple[Update, ...] = ()  # updates that changed this node's view, in order


def push_pull_interval(config: MembershipConfig, members: int) -> float:
    """memberlist's scaling: one full sync per interval up to 32 members, rarer above."""
    if members <= _PUSH_PULL_SCALE_THRESHOLD:
        return config.push_pull_interval_s
    scale = math.ceil(math.log2(members) - math.log2(_PUSH_PULL_SCALE_THRESHOLD)) + 1
    return scale * config.push_pull_interval_s
