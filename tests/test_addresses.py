"""The address a node advertises: parsing, refusals, and discovery on a machine with several
interfaces and IPv6 (a network namespace with two interfaces, where root and `ip` allow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from swarm.config import NodeConfig
from swarm.errors import ConfigError
from swarm.net.addresses import advertised_address, is_loopback, observed_host
from swarm.types import join_host_port, split_host_port


@pytest.mark.parametrize(
    ("address", "parts"),
    [
        ("10.0.0.5:7420", ("10.0.0.5", 7420)),
        ("[fd00::5]:7420", ("fd00::5", 7420)),
        ("node-a.lan:80", ("node-a.lan", 80)),
    ],
)
def test_host_port_round_trips(address: str, parts: tuple[str, int]) -> None:
    assert split_host_port(address) == parts
    assert join_host_port(*parts) == address


@pytest.mark.parametrize("bad", ["7420", "host:", ":7420", "host:0", "host:99999", "host:x"])
def test_malformed_addresses_are_refused_in_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not host:port"):
        split_host_port(bad)


def test_loopback_names_and_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("fd00::1")
    assert observed_host("10.1.2.3") == "10.1.2.3" and observed_host("garbage") is None


@pytest.mark.parametrize(
    ("advertise", "message"),
    [
        ("0.0.0.0:7420", "is a wildcard"),
        ("[::]:7420", "is a wildcard"),
        ("no-such-host.invalid:7420", "does not resolve"),
        ("10.1.2.3", "is not host:port"),
    ],
)
def test_a_bad_advertise_address_is_one_clear_line(advertise: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        advertised_address(NodeConfig(host="0.0.0.0", advertise=advertise), 7420)


def test_an_explicit_advertise_address_wins() -> None:
    chosen = advertised_address(NodeConfig(host="0.0.0.0", advertise="localhost:9000"), 7420)
    assert chosen.address == "localhost:9000" and chosen.how == "--advertise"


def test_loopback_is_never_advertised_to_a_remote_peer() -> None:
    for node in (
        NodeConfig(host="127.0.0.1", join=("10.9.8.7:7420",)),
        NodeConfig(host="0.0.0.0", advertise="127.0.0.1:7420", join=("10.9.8.7:7420",)),
    ):
        with pytest.raises(ConfigError, match="--advertise"):
            advertised_address(node, 7420)


def test_a_wildcard_node_joining_over_loopback_advertises_loopback() -> None:
    chosen = advertised_address(NodeConfig(host="0.0.0.0", join=("127.0.0.1:7420",)), 7421)
    assert chosen.address == "127.0.0.1:7421"


def _namespace_unavailable() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs Linux and root"
    if shutil.which("ip") is None:
        return "needs ip (iproute2)"
    return None


_DISCOVER = """
import json, sys
from swarm.config import NodeConfig
from swarm.errors import ConfigError
from swarm.net.addresses import advertised_address
host, join = sys.argv[1], tuple(a for a in sys.argv[2:] if a)
try:
    print(json.dumps(advertised_address(NodeConfig(host=host, join=join), 7420).address))
except ConfigError as e:
    print(json.dumps("error: " + str(e)))
"""


@pytest.mark.skipif(_namespace_unavailable() is not None, reason=str(_namespace_unavailable()))
def test_discovery_on_a_machine_with_two_interfaces_and_ipv6() -> None:
    ns = f"swarmaddr-{uuid.uuid4().hex[:8]}"

    def sh(*args: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *args], check=True, capture_output=True)

    def discover(host: str, join: str = "") -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _DISCOVER, host, join],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        return str(json.loads(done.stdout))

    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        sh("ip", "link", "set", "lo", "up")
        for i in (1, 2):
            # a veth pair inside the namespace: an interface that is up, like a NIC
            sh("ip", "link", "add", f"d{i}", "type", "veth", "peer", "name", f"p{i}")
            sh("ip", "addr", "add", f"10.77.{i}.2/24", "dev", f"d{i}")
            sh("ip", "link", "set", f"p{i}", "up")
            sh("ip", "link", "set", f"d{i}", "up")
        sh("ip", "-6", "addr", "add", "fd77::2/64", "dev", "d2", "nodad")
        # no default route and two addresses: the node cannot guess, and says what to set
        refused = discover("0.0.0.0")
        assert refused.startswith("error: ") and "--advertise" in refused
        assert "10.77.1.2" in refused and "10.77.2.2" in refused
        # the route to the bootstrap peer picks the interface peers share with this node
        assert discover("0.0.0.0", "10.77.2.9:7420") == "10.77.2.2:7420"
        assert discover("0.0.0.0", "10.77.1.9:7420") == "10.77.1.2:7420"
        assert discover("::", "[fd77::9]:7420") == "[fd77::2]:7420"
        # with a default route, the first node advertises the address on that route
        sh("ip", "route", "add", "default", "dev", "d1")
        assert discover("0.0.0.0") == "10.77.1.2:7420"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
