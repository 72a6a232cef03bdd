"""Separate hosts on one Linux machine: a network namespace per node, joined by veth pairs to a
bridge in the root namespace (whose address lets this process, the client, reach every node).
Multicast passes (no IGMP snooping on the bridge, a multicast route in each namespace), so
nodes find each other by mDNS as on a LAN. A link's bandwidth is capped with tbf, packets are
dropped at random and hosts are cut off from each other with nftables inside the namespaces,
so the client's own traffic is never cut.

Names carry a per-run id (interfaces stay within Linux's 15 characters) and the pid of the
process that made them, so a run killed before its teardown is cleaned up by the next one.
Addresses come from a private 10.213.X.0/24 that is not in use on this machine and exists only
inside these namespaces and on the bridge.

    with Lab(3) as lab:
        lab.start_node(0, ...); lab.cap_all(100); lab.lose(10); lab.cut([0], [1, 2]); lab.heal()
        lab.firewall(1, ["tcp dport 7421 drop"]); lab.add_address(2, "docker0", "172.17.0.1")
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swarm.config import RuntimeConfig
from swarm.demo import stop_nodes

API_TOKEN = "netns-lab-api-token"  # the Bearer token of every node a Lab starts
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}  # headers for the test client

PORT = 7420  # every host has its own address, so every node can use the default port
_NS_PREFIX = "swarmlab"
_LOSS_TABLE = "swarmloss"
_CUT_TABLE = "swarmcut"
_FIREWALL_TABLE = "swarmwall"
_TOOLS = ("ip", "tc", "nft")


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, as CI does)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 nftables; .ci/run does)"
    name = f"{_NS_PREFIX}-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_leftovers() -> None:
    """Delete namespaces and bridges of earlier runs whose process is gone."""
    pattern = re.compile(rf"^{_NS_PREFIX}-([0-9a-f]{{6}})-(\d+)-\d+")
    for line in _run("ip", "netns", "list").stdout.splitlines():
        match = pattern.match(line.split()[0]) if line.strip() else None
        if match and not _alive(int(match.group(2))):
            _run("ip", "netns", "del", line.split()[0], check=False)
            _run("ip", "link", "del", f"swb{match.group(1)}", check=False)


def _free_subnet() -> str:
    used = _run("ip", "-4", "-o", "addr").stdout
    for _ in range(100):
        prefix = f"10.213.{random.randrange(256)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.213.X.0/24 on this machine")


@dataclass
class Host:
    namespace: str
    veth: str  # the root end of its link; the namespace end is eth0
    ip: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{PORT}"


@dataclass
class Lab:
    size: int
    run_id: str = field(default_factory=lambda: f"{random.getrandbits(24):06x}")
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"swb{self.run_id}"

    def __enter__(self) -> Lab:
        reap_leftovers()
        prefix = _free_subnet()
        try:
            # no IGMP snooping: mDNS (LAN discovery) reaches every host, as on a home switch
            _run("ip", "link", "add", self.bridge, "type", "bridge", "mcast_snooping", "0")
            _run("ip", "addr", "add", f"{prefix}.1/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for i in range(self.size):
                self._add_host(i, f"{prefix}.{i + 2}")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_host(self, i: int, ip: str) -> None:
        host = Host(f"{_NS_PREFIX}-{self.run_id}-{os.getpid()}-{i}", f"swv{self.run_id}{i}", ip)
        ns = host.namespace
        _run("ip", "netns", "add", ns)
        self.hosts.append(host)  # from here on, close() removes it
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"swp{self.run_id}{i}")
        _run("ip", "link", "set", f"swp{self.run_id}{i}", "netns", ns, "name", "eth0")
        _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
        self.exec(i, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        self.exec(i, "ip", "link", "set", "eth0", "up")
        self.exec(i, "ip", "link", "set", "lo", "up")
        # a namespace has no default route: multicast (mDNS) needs one of its own
        self.exec(i, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")

    def exec(self, i: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.hosts[i].namespace, *args, check=check)

    # ---- nodes -----------------------------------------------------------------------------

    def start_node(
        self,
        i: int,
        runtime: RuntimeConfig,
        state_dir: Path,
        secret: Path,
        extra: Sequence[str] = (),
        join: str | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        """A real node process inside host i's namespace, on its address; returns host:port."""
        host = self.hosts[i]
        own_state = state_dir / f"host{i}"
        own_state.mkdir(parents=True, exist_ok=True)
        args = [
            *("ip", "netns", "exec", host.namespace, sys.executable, "-m", "swarm", "node"),
            *("--host", host.ip, "--port", str(PORT), "--secret-file", str(secret)),
            *("--state-dir", str(own_state)),
            # `extra` may name the model itself: a node refuses a second --model
            *([] if "--model" in extra else ["--model", runtime.model]),
            *("--cache-dir", str(runtime.cache_dir), "--dtype", runtime.dtype, *extra),
        ]
        if join:
            args += ["--join", join]
        with (state_dir / f"host{i}.log").open("ab") as log:  # the child keeps its own handle
            # off loopback a node's API needs a token: every node of the lab gets the same one
            env = {**os.environ, "SWARM_API_TOKEN": API_TOKEN, **(env or {})}
            host.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        return host.address

    def spawn(self, i: int, args: Sequence[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
        """Any command as a process in host i's namespace (kept for `stop_nodes`), run from
        `cwd`, its output appended to `log`."""
        host = self.hosts[i]
        with log.open("ab") as out:  # the child keeps its own handle
            host.process = subprocess.Popen(
                ["ip", "netns", "exec", host.namespace, *args],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return host.process

    def run_in(self, i: int, args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """A command in host i's namespace, run to its end from `cwd`."""
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[i].namespace, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def stop_nodes(self) -> None:
        processes = [h.process for h in self.hosts if h.process is not None]
        stop_nodes(processes)  # SIGTERM, then SIGKILL for any still running after 15 s
        for process in processes:
            process.wait()  # reaped, even when it had to be killed

    # ---- conditions ------------------------------------------------------------------------

    def cap(self, i: int, mbit: float) -> None:
        """Cap host i's link at `mbit` megabits per second in each direction."""
        rate = int(mbit * 1_000_000)
        burst = max(16 * 1024, rate // 8 // 500)  # 2 ms at full rate, and above a jumbo frame
        tbf = ("tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "100ms")
        _run("tc", "qdisc", "replace", "dev", self.hosts[i].veth, "root", *tbf)  # into host i
        self.exec(i, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf)  # out of host i

    def cap_all(self, mbit: float) -> None:
        for i in range(self.size):
            self.cap(i, mbit)

    def uncap_all(self) -> None:
        for i, host in enumerate(self.hosts):
            _run("tc", "qdisc", "del", "dev", host.veth, "root", check=False)
            self.exec(i, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def lose(self, percent: int, hosts: Iterable[int] | None = None) -> None:
        """Drop `percent`% of the packets arriving at each host, at random: every packet
        between two nodes runs that risk once."""
        for i in range(self.size) if hosts is None else hosts:
            self._table(i, _LOSS_TABLE, [f"iifname eth0 numgen random mod 100 < {percent} drop"])

    def cut(self, side: Iterable[int], other: Iterable[int]) -> None:
        """No packet passes between `side` and `other` (either way) until `heal`."""
        a, b = list(side), list(other)
        for mine, theirs in ((a, b), (b, a)):
            peers = ", ".join(self.hosts[j].ip for j in theirs)
            for i in mine:
                rules = [f"ip saddr {{ {peers} }} drop", f"ip daddr {{ {peers} }} drop"]
                self._table(i, _CUT_TABLE, rules)

    def isolate(self, i: int) -> None:
        self.cut([i], [j for j in range(self.size) if j != i])

    def firewall(self, i: int, rules: Sequence[str]) -> None:
        """Host i's own firewall: nftables `rules` (e.g. `tcp dport 7421 drop`) on what
        arrives at it from the bridge, until `heal`; the client's packets are filtered too."""
        self._table(i, _FIREWALL_TABLE, [f"iifname eth0 {rule}" for rule in rules])

    def add_address(self, i: int, interface: str, ip: str) -> None:
        """A second interface on host i, a bridge with no ports as docker0 is to its host,
        that holds `ip`, which no other host can route to."""
        self.exec(i, "ip", "link", "add", interface, "type", "bridge")
        self.exec(i, "ip", "addr", "add", f"{ip}/32", "dev", interface)
        self.exec(i, "ip", "link", "set", interface, "up")

    def heal(self) -> None:
        """Undo `cut`, `lose` and `firewall`."""
        for i in range(self.size):
            for table in (_CUT_TABLE, _LOSS_TABLE, _FIREWALL_TABLE):
                self.exec(i, "nft", "delete", "table", "inet", table, check=False)

    def _table(self, i: int, table: str, rules: Sequence[str]) -> None:
        self.exec(i, "nft", "delete", "table", "inet", table, check=False)
        script = [f"table inet {table} {{"]
        for hook in ("input", "output"):
            script.append(f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept;")
            script += [f"    {rule}" for rule in rules if hook == "input" or "iifname" not in rule]
            script.append("  }")
        script.append("}")
        subprocess.run(
            ["ip", "netns", "exec", self.hosts[i].namespace, "nft", "-f", "-"],
            input="\n".join(script),
            text=True,
            check=True,
            capture_output=True,
        )

    # ---- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the nodes and remove every namespace, link and the bridge; safe to repeat."""
        with contextlib.suppress(Exception):
            self.stop_nodes()
        for host in self.hosts:
            _run("ip", "netns", "del", host.namespace, check=False)
            _run("ip", "link", "del", host.veth, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()
