"""The address a node tells its peers: where they can reach it.

A node bound to one concrete address advertises it. A node bound to a wildcard (0.0.0.0 or ::)
must pick one of the machine's addresses, and the right one is the one its peers use: the local
address of its route to a bootstrap peer (the kernel's routing table answers without sending a
packet), or, for the first node, the address of its default route or its only interface. A
`--advertise host:port` overrides all of this. A wildcard or loopback address is never
advertised to a peer that is not on loopback: the node refuses to start instead, with one line
that names `--advertise`. The join answer then confirms the choice: the bootstrap peer reports
the address it saw the node connect from (see `Gossiper`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from swarm.config import NodeConfig
from swarm.errors import ConfigError
from swarm.types import join_host_port, split_host_port

log = logging.getLogger(__name__)

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")
# Documentation addresses (RFC 5737, RFC 3849): a route lookup towards them finds the default
# route. Nothing is ever sent to them: connecting a UDP socket only consults the routing table.
_DEFAULT_ROUTE_PROBES = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}


def is_wildcard(host: str) -> bool:
    return host in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    """True for loopback addresses and names that resolve only to loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        resolved = _resolve(host)
        return bool(resolved) and all(ipaddress.ip_address(ip).is_loopback for ip in resolved)


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class AdvertisedAddress:
    address: str  # host:port peers dial
    how: str  # why this one, for the start-up log line


def advertised_address(node: NodeConfig, bound_port: int) -> AdvertisedAddress:
    """The address to put in this node's member record, or ConfigError with one line."""
    remote_joins = [a for a in node.join if not is_loopback(split_host_port(a)[0])]
    if node.advertise:
        chosen = _explicit(node.advertise)
    elif not is_wildcard(node.host):
        chosen = AdvertisedAddress(join_host_port(node.host, bound_port), "the bound address")
    else:
        chosen = _discover(node.host, node.join, bound_port)
    host, _ = split_host_port(chosen.address)
    if remote_joins and is_loopback(host):
        raise ConfigError(
            f"this node would advertise the loopback address {chosen.address} ({chosen.how}), "
            f"which peers at {remote_joins[0]} cannot reach: bind --host 0.0.0.0 (or this "
            "machine's address), or set --advertise host:port"
        )
    return chosen


def _explicit(advertise: str) -> AdvertisedAddress:
    host, _ = split_host_port(advertise)
    if is_wildcard(host):
        raise ConfigError(
            f"--advertise {advertise} is a wildcard: give the address peers dial, e.g. "
            "192.168.1.10:7420"
        )
    if not _resolve(host):
        raise ConfigError(f"--advertise {advertise}: the name {host!r} does not resolve")
    return AdvertisedAddress(advertise, "--advertise")


def _discover(bind_host: str, join: Sequence[str], port: int) -> AdvertisedAddress:
    family = socket.AF_INET6 if ":" in bind_host.strip("[]") else socket.AF_INET
    for bootstrap in join:
        host, _ = split_host_port(bootstrap)
        for ip in _resolve(host):
            if family == socket.AF_INET and ":" in ip:
                continue  # a node bound to 0.0.0.0 cannot take IPv6 connections
            source = route_source(ip)
            if source is not None:
                return AdvertisedAddress(
                    join_host_port(source, port), f"the route to the bootstrap peer {bootstrap}"
                )
        log.warning("bootstrap address %s does not resolve to a routable address", bootstrap)
    families = [family] if family == socket.AF_INET else [socket.AF_INET6, socket.AF_INET]
    for fam in families:
        source = route_source(_DEFAULT_ROUTE_PROBES[fam])
        if source is not None and not is_loopback(source):
            return AdvertisedAddress(join_host_port(source, port), "the default route")
    candidates = interface_addresses(families)
    if len(candidates) == 1:
        return AdvertisedAddress(join_host_port(candidates[0], port), "the only interface")
    if not candidates:
        loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        return AdvertisedAddress(join_host_port(loopback, port), "no interface but loopback")
    raise ConfigError(
        f"bound to {bind_host or 'all addresses'} with no route to choose between this "
        f"machine's addresses ({', '.join(candidates)}): set --advertise host:port to the one "
        "peers reach"
    )


def route_source(ip: str) -> str | None:
    """The local address the kernel would send from to reach `ip`, or None without a route.
    Connecting a UDP socket consults the routing table and sends nothing."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((ip, 9))
            return str(probe.getsockname()[0]).split("%")[0]
    except OSError:
        return None


def interface_addresses(families: Sequence[int]) -> list[str]:
    """This machine's addresses on interfaces that are up, loopback and link-local left out
    (a link-local IPv6 address needs a scope that differs per peer)."""
    stats = psutil.net_if_stats()
    found: list[str] = []
    for name, addresses in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addresses:
            if a.family not in families:
                continue
            ip = ipaddress.ip_address(a.address.split("%")[0])
            if not (ip.is_loopback or ip.is_link_local) and str(ip) not in found:
                found.append(str(ip))
    return found


def observed_host(address: str | None) -> str | None:
    """The host part of a peer-reported address, or None when it is absent or malformed."""
    if not address:
        return None
    try:
        return str(ipaddress.ip_address(address.strip("[]").split("%")[0]))
    except ValueError:
        return None
