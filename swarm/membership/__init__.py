"""Membership: who is in the swarm, as SWIM failure detection over gossip.

Pure parts live here: the member table (`view`), gossip updates (`updates`), the piggyback
queue (`broadcast`), protocol messages (`messages`) and one node's protocol state machine
(`protocol`). The networked gossiper (`gossip`) drives `protocol` with real timers and links.
"""

from swarm.membership.broadcast import BroadcastQueue, retransmit_limit
from swarm.membership.messages import Ack, Gossip, Message, Ping, PingReq, PushPull, Send
from swarm.membership.protocol import (
    NodeState,
    ProtocolLimits,
    Step,
    announce,
    join,
    leave,
    next_wakeup,
    poll,
    receive,
    start,
)
from swarm.membership.updates import Alive, Dead, Left, Suspect, Update
from swarm.membership.view import MemberEntry, MembershipView, refute

__all__ = [
    "Ack",
    "Alive",
    "BroadcastQueue",
    "Dead",
    "Gossip",
    "Left",
    "MemberEntry",
    "MembershipView",
    "Message",
    "NodeState",
    "Ping",
    "PingReq",
    "ProtocolLimits",
    "PushPull",
    "Send",
    "Step",
    "Suspect",
    "Update",
    "announce",
    "join",
    "leave",
    "next_wakeup",
    "poll",
    "receive",
    "refute",
    "retransmit_limit",
    "start",
]
