"""What `swarm doctor` looks at, gathered from this machine: the asked node's status, then for
every member at once a TCP connect to its HTTP port, the fast port it answers on its link path
(as peers learn it) and a connect to that, its own status and clock, and, given the secret, a
probe frame that changes nothing. Every wait has its timeout; what failed is a fact too."""

from __future__ import annotations

import asyncio
import email.utils
import errno
import secrets
import time
from dataclasses import dataclass

import aiohttp

from swarm.client import SwarmClient
from swarm.doctor.facts import Connect, KeyProbe, MemberFacts, Observed
from swarm.errors import StatusFormatError, SwarmError
from swarm.membership.gossip import GOSSIP_PATH, REFUSAL_HEADER, seal_key_probe
from swarm.net.fast_links import FAST_PORT_HEADER
from swarm.net.links import LINK_PATH
from swarm.schema import MemberRow, NodeStatus, from_json
from swarm.types import NodeId, split_host_port
from swarm.wire import FrameCodec, SwarmKeys

_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


@dataclass(frozen=True)
class Budget:
    connect_timeout_s: float = 2.0  # seconds a TCP connect to a member's port may take
    request_timeout_s: float = 5.0  # seconds a member has to answer one HTTP request


async def gather(
    address: str, token: str | None, secret: bytes | None, budget: Budget = Budget()
) -> Observed:
    """Everything the checks read; the asked node's silence is an `Observed` too."""
    try:
        status = await SwarmClient(address, budget.request_timeout_s, token).status()
    except SwarmError as e:
        return Observed(address, None, str(e), connect_timeout_s=budget.connect_timeout_s)
    probe = None if secret is None else _probe_codec(secret)
    own: set[str] = set()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=budget.request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        looks = (_member(http, row, budget, probe, own) for row in status.members)
        members = await asyncio.gather(*looks)
    return Observed(
        address,
        status,
        members=tuple(members),
        own_hosts=frozenset(own),
        connect_timeout_s=budget.connect_timeout_s,
    )


def _probe_codec(secret: bytes) -> FrameCodec:
    sender = NodeId(f"doctor-{secrets.token_hex(4)}")
    return FrameCodec(SwarmKeys.derive(secret).gossip, sender, accept_unaddressed=True)


async def _member(
    http: aiohttp.ClientSession,
    row: MemberRow,
    budget: Budget,
    probe: FrameCodec | None,
    own: set[str],
) -> MemberFacts:
    host, port = split_host_port(row.address)
    reached = await connect(host, port, budget.connect_timeout_s, own)
    if row.state == "left" or reached.outcome != "ok":
        return MemberFacts(row, reached)
    base = f"http://{row.address}"
    said_port, (status, error, offset) = await asyncio.gather(
        _fast_port(http, base), _status(http, base)
    )
    if said_port is None and status is not None:
        said_port = status.node.fast_port
    fast = None if said_port is None else await connect(host, said_port, budget.connect_timeout_s)
    key = None if probe is None else await _key_probe(http, base, probe, NodeId(row.id))
    return MemberFacts(row, reached, fast, status, error, offset, key)


async def connect(host: str, port: int, timeout_s: float, own: set[str] | None = None) -> Connect:
    """A TCP connect and close; `own` collects the local address it left from."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host.strip("[]"), port)
    except TimeoutError:
        return Connect(port, "timeout")
    except ConnectionRefusedError:
        return Connect(port, "refused")
    except OSError as e:
        why = e.strerror or str(e)
        if e.errno in _UNREACHABLE:
            return Connect(port, "unreachable", why)
        return Connect(port, "error", why)
    if own is not None:
        own.add(str(writer.get_extra_info("sockname")[0]))
    writer.close()
    await writer.wait_closed()
    return Connect(port, "ok")


async def _fast_port(http: aiohttp.ClientSession, base: str) -> int | None:
    """The fast port the member's link path answers with, as a peer learns it."""
    try:
        async with http.get(f"{base}{LINK_PATH}") as reply:
            said = reply.headers.get(FAST_PORT_HEADER, "")
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    return int(said) if said.isdigit() and 0 < int(said) < 65536 else None


async def _status(
    http: aiohttp.ClientSession, base: str
) -> tuple[NodeStatus | None, str, float | None]:
    """Its status, or why not; and its clock minus this machine's at the request's middle
    (its frames' clock where its status says it, else its Date header, to the second)."""
    sent = time.time()
    try:
        async with http.get(f"{base}/status") as reply:
            received = time.time()
            date = reply.headers.get("Date")
            if reply.status != 200:
                return None, f"/status answered {reply.status}", _date_offset(date, sent, received)
            body = await reply.json()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
        return None, f"/status: {e or type(e).__name__}", None
    try:
        status = from_json(NodeStatus, body)
    except StatusFormatError as e:
        return None, str(e), _date_offset(date, sent, received)
    if status.node.clock_unix is None:
        return status, "", _date_offset(date, sent, received)
    return status, "", status.node.clock_unix - (sent + received) / 2


def _date_offset(date: str | None, sent: float, received: float) -> float | None:
    if date is None:
        return None
    try:
        said = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None
    # the header is whole seconds: it was written between sent and received, within a second
    middle = (sent + received) / 2
    return 0.0 if said <= middle <= said + 1 + (received - sent) else said + 0.5 - middle


async def _key_probe(
    http: aiohttp.ClientSession, base: str, codec: FrameCodec, receiver: NodeId
) -> KeyProbe:
    try:
        async with http.post(f"{base}{GOSSIP_PATH}", data=seal_key_probe(codec, receiver)) as r:
            if r.status == 204:
                return KeyProbe(accepted=True)
            text = (await r.text())[:200]
            return KeyProbe(False, r.headers.get(REFUSAL_HEADER, ""), text)
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return KeyProbe(False, "", f"no answer: {e or type(e).__name__}")
