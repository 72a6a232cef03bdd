"""What a node announces on the LAN by DNS-SD, and what it makes of what others announce. Pure:
the mDNS side is `swarm.net.mdns`.

A swarm is named by a fingerprint: the first bytes of a key that HKDF derives from the secret
under its own label (`SwarmKeys.discovery`). Anyone on the LAN can read it; it tells nothing of
the secret, so it only sorts announcements into this swarm and others. A node joins only the
members that carry its own fingerprint, and the join itself still has to pass the gossip key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from swarm.errors import ConfigError
from swarm.types import NodeId, split_host_port
from swarm.wire import SwarmKeys

SERVICE_TYPE = "_swarm._tcp.local."
VERSION = "1"  # of the announcement's fields below; another version is not read
FINGERPRINT_BYTES = 16  # 128 bits: swarms on one LAN never share one by chance
_MAX_FIELD = 255  # a TXT string's limit


def fingerprint(keys: SwarmKeys) -> str:
    """The swarm's name on the LAN, 32 hex characters."""
    return keys.discovery[:FINGERPRINT_BYTES].hex()


def instance_name(node_id: NodeId) -> str:
    """The DNS-SD name a node announces itself under: unique, as its id is."""
    return f"swarm-{node_id}.{SERVICE_TYPE}"


def announcement(swarm: str, node_id: NodeId, address: str) -> dict[str, str]:
    """The TXT fields of a node's announcement: the fingerprint of its swarm, its id and the
    address it advertises to peers (host:port), which is what others join through."""
    return {"v": VERSION, "swarm": swarm, "id": node_id, "address": address}


@dataclass(frozen=True)
class Member:
    """An announcement of this node's swarm: join through `address`."""

    node_id: NodeId
    address: str


@dataclass(frozen=True)
class Stranger:
    """An announcement of another swarm."""

    swarm: str


@dataclass(frozen=True)
class Unreadable:
    """An announcement this node cannot use, and why."""

    why: str


Announcement = Member | Stranger | Unreadable


def read_announcement(
    fields: Mapping[bytes, bytes | None], swarm: str, me: NodeId
) -> Announcement | None:
    """What a DNS-SD TXT record says, for a node of swarm `swarm` whose id is `me`; None for
    this node's own announcement."""
    text: dict[str, str] = {}
    for key, value in fields.items():
        if value is None or len(value) > _MAX_FIELD:
            continue
        try:
            text[key.decode("ascii")] = value.decode("utf-8")
        except UnicodeDecodeError:
            return Unreadable(f"field {key!r} is not text")
    if text.get("v") != VERSION:
        return Unreadable(f"version {text.get('v')!r}, not {VERSION!r}")
    theirs, node_id, address = text.get("swarm"), text.get("id"), text.get("address")
    if not theirs or not node_id or not address:
        missing = [k for k in ("swarm", "id", "address") if not text.get(k)]
        return Unreadable(f"no {', '.join(missing)}")
    if theirs != swarm:
        return Stranger(theirs)
    if node_id == me:
        return None
    try:
        split_host_port(address)
    except ConfigError as e:
        return Unreadable(f"address {address!r}: {e}")
    return Member(NodeId(node_id), address)
