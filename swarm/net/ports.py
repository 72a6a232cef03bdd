"""The ports a node listens on, bound before it loads anything: a port that is taken fails the
start at once, in one line naming it (and the process holding it, where /proc tells), instead
of after minutes of loading a model.

A node takes its own port (`node.port`: HTTP API, gossip, links) and its fast links' port
(`net.fast_port`). The fast port is 7421 beside the default 7420, the pair the README's
firewall recipe opens; beside any other port it is one the system picks. Taking the port
beside the node's own broke the next node on the machine: a node on 18101 that took 18102
made a second one on 18102 fail. Peers learn the fast port from the link path's answer
(`X-Swarm-Fast-Port`), so nothing needs to predict it; across a firewall, `--fast-port` names
one to let through (unreached, the steps go over the websocket). The node's start line
says which fast port it took."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from swarm.config import DEFAULT_PORT, NetConfig, NodeConfig
from swarm.errors import BindError

log = logging.getLogger(__name__)

_BACKLOG = 128  # fast links waiting to be accepted
_LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
_COMMAND_CHARS = 80  # of a holder's command line, in the error


@dataclass(frozen=True)
class Listener:
    """One of a node's ports, as an error names it."""

    name: str  # "port", "fast port"
    flag: str  # the flag that sets it


NODE_PORT = Listener("port", "--port")
FAST_PORT = Listener("fast port", "--fast-port")


@dataclass(frozen=True)
class FastPortChoice:
    port: int  # the port to ask for; 0: any the system picks
    fallback: bool  # taken: take any free port instead of refusing to start


def fast_port_choice(node_port: int, configured: int) -> FastPortChoice:
    """Which port the fast links ask for (`node_port` and `configured` as the config says).
    A port the user names is theirs: taken, the start fails. 7421 beside the default port is
    what the README's firewall recipe opens, but nobody named it: taken, any other does (the
    start line and a warning say which). Beside any other port, the system's pick: the port
    beside it is the next one a user starting another node is likely to ask for."""
    if configured:
        return FastPortChoice(configured, fallback=False)
    if node_port == DEFAULT_PORT:
        return FastPortChoice(DEFAULT_PORT + 1, fallback=True)
    return FastPortChoice(0, fallback=False)


@dataclass
class BoundPorts:
    """The node's sockets, bound: `http` listens once the HTTP server starts (until then a
    client is refused, not kept waiting while the model loads); `fast` listens at once (peers
    learn its port only from a serving node). `fast` is None with `net.fast_links` off."""

    http: socket.socket
    fast: socket.socket | None

    @property
    def http_port(self) -> int:
        return int(self.http.getsockname()[1])

    def http_failure(self, error: OSError) -> BindError:
        """What a failed listen on `http` says."""
        host, port = self.http.getsockname()[:2]
        holder = port_holder(port) if error.errno == errno.EADDRINUSE else None
        return BindError(bind_failure(NODE_PORT, host, port, error, holder))

    def close(self) -> None:
        self.http.close()
        if self.fast is not None:
            self.fast.close()


def bind_ports(node: NodeConfig, net: NetConfig) -> BoundPorts:
    """Bind the node's port, then the fast links'; BindError naming the one that failed."""
    http = bind_port(node.host, node.port, NODE_PORT)
    try:
        fast = bind_fast_port(node.host, node.port, net.fast_port) if net.fast_links else None
    except BaseException:
        http.close()
        raise
    return BoundPorts(http, fast)


def bind_fast_port(host: str, node_port: int, configured: int) -> socket.socket:
    """The fast links' socket, listening (see `fast_port_choice` for which port)."""
    choice = fast_port_choice(node_port, configured)
    try:
        sock = bind_port(host, choice.port, FAST_PORT)
    except BindError as e:
        if not choice.fallback:
            raise
        log.warning("%s; the fast links take a port the system picks instead", e)
        sock = bind_port(host, 0, FAST_PORT)
    if not choice.port and node_port and sock.getsockname()[1] == node_port + 1:
        # the system's pick fell on the next node's port: pick again while holding this one
        beside, sock = sock, bind_port(host, 0, FAST_PORT)
        beside.close()
    try:
        sock.listen(_BACKLOG)
    except OSError as e:  # two sockets bound at once with SO_REUSEADDR: the second to listen
        sock.close()
        raise BindError(bind_failure(FAST_PORT, host, choice.port, e, None)) from None
    return sock


def bind_port(host: str, port: int, listener: Listener) -> socket.socket:
    """A TCP socket bound to `host:port` (0: a port the system picks), not listening yet."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # a restarted node binds its port again while its old connections sit in TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        holder = port_holder(port) if e.errno == errno.EADDRINUSE else None
        raise BindError(bind_failure(listener, host, port, e, holder)) from None
    return sock


def bind_failure(
    listener: Listener, host: str, port: int, error: OSError, holder: str | None
) -> str:
    """The one line a failed bind or listen of `listener` on `host:port` says."""
    name, flag = listener.name, listener.flag
    if error.errno == errno.EADDRINUSE:
        by = holder or "another program"
        return f"{name} {port} is already in use by {by}: stop it, or choose another {flag}"
    if error.errno == errno.EACCES:
        return f"cannot listen on {name} {port}: permission denied (ports below 1024 need root)"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is not an address of this machine (--host)"
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {host}:{port}: {host} is not a known host name (--host)"
    return f"cannot listen on {name} {port} of {host}: {error.strerror or error}"


def listening_inodes(table: str, port: int) -> set[int]:
    """The inodes of the sockets that listen on `port` in /proc/net/tcp (or tcp6) text."""
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN_STATE:
            continue
        local_port = int(fields[1].rpartition(":")[2], 16)
        if local_port == port and fields[9] != "0":
            found.add(int(fields[9]))
    return found


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """`pid N (its command line)` of the process listening on `port`, where /proc tells: on
    Linux, for a process this user may look into. Only on a failed start, so its cost (a
    read of every process's descriptors) does not matter."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            inodes |= listening_inodes((proc / "net" / table).read_text(), port)
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return None
    with contextlib.suppress(OSError):
        for process in proc.iterdir():
            if process.name.isdigit() and _holds(process, wanted):
                return f"pid {process.name} ({_command_line(process)})"
    return None


def _holds(process: Path, sockets: set[str]) -> bool:
    try:
        return any(os.readlink(fd) in sockets for fd in (process / "fd").iterdir())
    except OSError:  # another user's process, or one that just exited
        return False


def _command_line(process: Path) -> str:
    try:
        words = (process / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    line = " ".join(" ".join(w.decode(errors="replace").split()) for w in words)
    return line if len(line) <= _COMMAND_CHARS else line[: _COMMAND_CHARS - 3] + "..."
