"""Finding the swarm on the LAN: a node announces itself by mDNS/DNS-SD (`zeroconf`) and, when
it has no bootstrap address, browses for the announcements of its own swarm
(`swarm.net.discovery` reads them) and hands their addresses to membership to join.

zeroconf runs its own event loop on its own thread. Its blocking calls (opening the sockets,
announcing, resolving a name, the goodbye) go through `asyncio.to_thread`, and its browser's
callback only hands a name to this loop, so the event loop that serves gossip and requests
never waits on the LAN.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncGenerator
from typing import Any

from zeroconf import (
    Error as ZeroconfError,
)
from zeroconf import (
    InterfaceChoice,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from swarm.net.addresses import interface_addresses, is_loopback
from swarm.net.discovery import (
    SERVICE_TYPE,
    Member,
    Stranger,
    Unreadable,
    announcement,
    instance_name,
    read_announcement,
)
from swarm.types import split_host_port
from swarm.wire import Peer

log = logging.getLogger(__name__)

_RESOLVE_TIMEOUT_MS = 3000  # milliseconds zeroconf waits for an announced name's records
_FOUND = 64  # announced names waiting to be resolved; more are dropped (the browser repeats)
# seconds the start (sockets, the announcement's probing) and the goodbye may take, each
_OPEN_TIMEOUT_S = 10.0
_CLOSE_TIMEOUT_S = 5.0
_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class LanDiscovery:
    def __init__(self, swarm: str, me: Peer, browse: bool) -> None:
        """`swarm`: this swarm's fingerprint; `me`: this node, at the address it advertises;
        `browse`: look for members too, not only announce this node."""
        self._swarm = swarm
        self._me = me
        self._browse = browse
        self._strangers: set[str] = set()  # fingerprints of other swarms, said once each

    async def members(self) -> AsyncGenerator[str, None]:
        """Announce this node until cancelled, and yield the address of each member of its
        swarm found on the LAN (once each). Yields nothing without browsing, or where the
        LAN cannot be used: it then logs why and waits."""
        host, _ = split_host_port(self._me.address)
        if is_loopback(host):
            log.debug("no LAN discovery: this node advertises a loopback address")
            return
        names: asyncio.Queue[str] = asyncio.Queue(maxsize=_FOUND)
        loop = asyncio.get_running_loop()

        def on_change(
            zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
        ) -> None:  # on the browser's thread
            if state_change is not ServiceStateChange.Removed:
                loop.call_soon_threadsafe(_offer, names, name)

        try:
            async with asyncio.timeout(_OPEN_TIMEOUT_S):
                zc = await asyncio.to_thread(self._open, host)
        except (OSError, RuntimeError, ZeroconfError, TimeoutError) as e:
            log.warning("LAN discovery off: %s", e or type(e).__name__)
            return
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change]) if self._browse else None
        log.info(
            "announcing this node on the LAN%s", " and looking for its swarm" if browser else ""
        )
        try:
            found: set[str] = set()
            while True:
                name = await names.get()
                address = await self._resolve(zc, name)
                if address is not None and address not in found:
                    found.add(address)
                    yield address
        finally:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await asyncio.to_thread(_close, zc, browser)

    def _open(self, host: str) -> Zeroconf:
        """Zeroconf on the interface of the advertised address (where peers reach this node),
        else on every interface, with this node announced. Blocking."""
        local = host in interface_addresses(_FAMILIES)
        zc = Zeroconf(interfaces=[host] if local else InterfaceChoice.All)
        try:
            zc.register_service(self._info(host))
        except BaseException:
            zc.close()
            raise
        return zc

    def _info(self, host: str) -> ServiceInfo:
        _, port = split_host_port(self._me.address)
        node_id = self._me.node_id
        fields = announcement(self._swarm, node_id, self._me.address)
        addresses: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            addresses["parsed_addresses"] = [str(ipaddress.ip_address(host))]
        return ServiceInfo(
            SERVICE_TYPE,
            instance_name(node_id),
            port=port,
            properties=fields,
            server=f"swarm-{node_id}.local.",
            **addresses,
        )

    async def _resolve(self, zc: Zeroconf, name: str) -> str | None:
        """The join address an announced name gives, or None (another swarm, this node, or
        an announcement that cannot be read, each logged)."""
        info = await asyncio.to_thread(zc.get_service_info, SERVICE_TYPE, name, _RESOLVE_TIMEOUT_MS)
        if info is None:
            log.debug("LAN: no answer for %s", name)
            return None
        found = read_announcement(info.properties, self._swarm, self._me.node_id)
        if isinstance(found, Member):
            log.info("found member %s of this swarm on the LAN at %s", found.node_id, found.address)
            return found.address
        if isinstance(found, Stranger) and found.swarm not in self._strangers:
            self._strangers.add(found.swarm)
            log.info(
                "another swarm (%s...) announces itself on this LAN: not joining it",
                found.swarm[:8],
            )
        elif isinstance(found, Unreadable):
            log.debug("LAN: ignoring %s: %s", name, found.why)
        return None


def _offer(names: asyncio.Queue[str], name: str) -> None:
    with contextlib.suppress(asyncio.QueueFull):
        names.put_nowait(name)


def _close(zc: Zeroconf, browser: ServiceBrowser | None) -> None:
    """Say goodbye (others drop this node's announcement at once) and close. Blocking."""
    if browser is not None:
        browser.cancel()
    try:
        zc.unregister_all_services()
    finally:
        zc.close()
