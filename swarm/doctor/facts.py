"""What `swarm doctor` observed of a swarm, as plain records: the asked node's status, and per
member what this machine saw of it (its ports, its own status, its clock, a probe sealed with
the secret). `gather` fills them; the checks read nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from swarm.schema import MemberRow, NodeStatus

# how a TCP connect from this machine ended: ok; refused (nothing listens, or a firewall
# rejects); timeout (a firewall drops it, or no host answers); unreachable (no route); error
Outcome = Literal["ok", "refused", "timeout", "unreachable", "error"]
Level = Literal["ok", "warn", "FAIL"]
Check = Literal[
    "node",  # the asked node answers
    "reach",  # this machine reaches a member's HTTP port
    "fast_port",  # ... and its fast port
    "reach_back",  # the members reach each other
    "duplicate_address",  # two members advertise one address
    "address",  # the address a member advertises, and why
    "refused",  # frames a member refused, by peer and cause
    "key",  # a member takes frames sealed with the given secret
    "clock",  # a member's clock against this machine's
    "coverage",  # every layer of a model is served
]


@dataclass(frozen=True)
class Connect:
    """A TCP connect from this machine to one port."""

    port: int
    outcome: Outcome
    detail: str = ""  # the system's words, where it said more


@dataclass(frozen=True)
class KeyProbe:
    """A frame that changes nothing, sealed here with the given secret and this machine's
    clock, posted to the member's gossip path."""

    accepted: bool
    refusal: str = ""  # the member's cause when refused (wrong_key, clock, version, ...)
    detail: str = ""  # its words, or why the probe got no answer


@dataclass(frozen=True)
class MemberFacts:
    row: MemberRow  # the member as the asked node lists it
    http: Connect
    fast: Connect | None = None  # None when no fast port was learned
    status: NodeStatus | None = None  # its own /status, where it answered
    status_error: str = ""  # why not, where it did not
    # its frames' clock minus this machine's, in seconds (from its status, or its HTTP
    # Date header to the second); None when unknown
    clock_offset_s: float | None = None
    key_probe: KeyProbe | None = None  # None without --secret-file


@dataclass(frozen=True)
class Observed:
    asked: str  # the address doctor was given (--node)
    status: NodeStatus | None  # the asked node's status; None when it did not answer
    error: str = ""  # why it did not
    members: tuple[MemberFacts, ...] = ()
    # this machine's own addresses, as its connections left it: refusals from them are the
    # doctor's own probes, not a peer's
    own_hosts: frozenset[str] = frozenset()
    connect_timeout_s: float = 2.0


@dataclass(frozen=True)
class Verdict:
    level: Level
    check: Check
    message: str  # one line: what is wrong and the fix, or what is right
