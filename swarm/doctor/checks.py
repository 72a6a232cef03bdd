"""`swarm doctor`'s checks: pure functions from what was observed (`Observed`) to one verdict
line each, ok, warn or FAIL, each FAIL naming the fix. Nothing here waits or reads a socket."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from swarm.doctor.facts import Connect, MemberFacts, Observed, Verdict
from swarm.schema import NodeStatus, RefusedPeer
from swarm.types import split_host_port

# a refusal this recent is a fault now; an older one is history worth a warning
RECENT_REFUSAL_S = 300.0
# a clock this far from this machine's, as a share of the frames' window, is worth a warning
CLOCK_WARN_SHARE = 0.5
_GONE = ("dead", "left")
_CAUSES = {  # a refusal's cause: what it means, and the fix
    "wrong_key": "another swarm secret: give it the swarm's key file (--secret-file) or an "
    "invite line",
    "clock": "clocks apart by more than the frames' window: run NTP on both "
    "(timedatectl set-ntp true)",
    "version": "another protocol version: run the same swarm version on every node",
    "misaddressed": "frames meant for another node: two nodes answer at one address "
    "(give each --advertise its own)",
}


def diagnose(observed: Observed) -> list[Verdict]:
    """Every check's verdicts, in the order the report prints them."""
    if observed.status is None:
        return [Verdict("FAIL", "node", _silent(observed))]
    members = tuple(m for m in observed.members if m.row.state != "left")
    per_member: tuple[Callable[[MemberFacts, Observed], list[Verdict]], ...] = (
        reach,
        fast_port,
        reach_back,
        address,
        key,
        clock,
    )
    verdicts = [v for m in members for check in per_member for v in check(m, observed)]
    return [*verdicts, *duplicates(members), *refused(observed), *coverage(observed)]


def _silent(observed: Observed) -> str:
    return (
        f"the node at {observed.asked} does not answer: {observed.error}. Is it running, "
        "and is this its HTTP port (--node host:port, 7420 unless --port)?"
    )


def _name(m: MemberFacts) -> str:
    return f"{m.row.id} at {m.row.address}"


def _failed_connect(c: Connect, timeout_s: float) -> str:
    if c.outcome == "timeout":
        return f"no answer on port {c.port} within {timeout_s:g} s (a firewall drops it?)"
    if c.outcome == "refused":
        return f"port {c.port} refuses connections (nothing listens there, or a firewall rejects)"
    if c.outcome == "unreachable":
        return f"no route to port {c.port} ({c.detail or 'unreachable'})"
    return f"port {c.port}: {c.detail or c.outcome}"


def reach(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """This machine reaches the member's HTTP port (API, gossip, links)."""
    if m.http.outcome == "ok":
        return [Verdict("ok", "reach", f"{_name(m)}: HTTP port answers")]
    why = _failed_connect(m.http, observed.connect_timeout_s)
    if m.row.state in _GONE:
        return [Verdict("warn", "reach", f"{_name(m)} is {m.row.state} and {why}: gone?")]
    host, port = split_host_port(m.row.address)
    fix = (
        f"if it runs, let TCP port {port} through its firewall ({_ufw(port, None)}), or check "
        f"that peers can route to {host} (--advertise)"
    )
    return [Verdict("FAIL", "reach", f"{_name(m)}: {why}; {fix}")]


def _ufw(http_port: int, fast: int | None) -> str:
    if fast == http_port + 1:
        return f"ufw allow {http_port}:{fast}/tcp"
    return f"ufw allow {http_port}/tcp" if fast is None else f"ufw allow {fast}/tcp"


def fast_port(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """The member's fast port answers where its HTTP port does: a firewall that lets one
    through and drops the other is the usual cause of slow steps."""
    if m.http.outcome != "ok":
        return []
    if m.fast is None:
        return [
            Verdict(
                "warn",
                "fast_port",
                f"{_name(m)} says no fast port: decode steps to it "
                "take its websocket (net.fast_links off?)",
            )
        ]
    if m.fast.outcome == "ok":
        return [Verdict("ok", "fast_port", f"{_name(m)}: fast port {m.fast.port} answers")]
    why = _failed_connect(m.fast, observed.connect_timeout_s)
    _, http_port = split_host_port(m.row.address)
    fix = f"on that host: {_ufw(http_port, m.fast.port)}"
    if m.fast.port == http_port + 1:
        fix += f" (or firewall-cmd --add-port={http_port}-{m.fast.port}/tcp)"
    return [Verdict("FAIL", "fast_port", f"{_name(m)}: HTTP answers but fast {why}; {fix}")]


def reach_back(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """The others see the member alive: one they list as suspect or dead, or cannot send
    to, while this machine reaches it, takes their frames out but not theirs in."""
    if m.http.outcome != "ok":
        return []
    doubts = [
        f"{seer} sees it {how}"
        for seer, how in _views_of(m.row.id, observed.members)
        if how != "alive"
    ]
    if m.status is not None and not m.status.node.reachable_by_peers:
        doubts.append("it says peers take its messages but none of theirs arrive")
    if not doubts:
        return [Verdict("ok", "reach_back", f"{_name(m)}: its peers reach it")]
    return [
        Verdict(
            "FAIL",
            "reach_back",
            f"{_name(m)}: {'; '.join(doubts)}, though this machine reaches it: its peers' "
            f"messages do not arrive (a firewall on it for their addresses, or an address "
            f"they cannot route to: --advertise)",
        )
    ]


def _views_of(node_id: str, members: Iterable[MemberFacts]) -> list[tuple[str, str]]:
    """(who, how) for every other member whose status lists `node_id`: its state there, or
    'unreachable' when that member's messages to it fail."""
    views = []
    for other in members:
        if other.status is None or other.row.id == node_id:
            continue
        for row in other.status.members:
            if row.id != node_id:
                continue
            how = "unreachable" if row.state == "alive" and row.reachable is False else row.state
            views.append((other.row.id, how))
    return views


def address(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """The address the member advertises, and why it chose it, where it says."""
    if m.status is None:
        return []
    because = m.status.node.address_because or "its status does not say why"
    return [Verdict("ok", "address", f"{m.row.id} advertises {m.row.address} ({because})")]


def key(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """The member takes a frame sealed here with the given secret and this machine's clock."""
    probe = m.key_probe
    if probe is None:
        return []
    if probe.accepted:
        return [Verdict("ok", "key", f"{_name(m)} takes frames sealed with this secret")]
    if probe.refusal == "wrong_key":
        return [
            Verdict(
                "FAIL",
                "key",
                f"{_name(m)} refuses frames sealed with the secret "
                "given here: it runs with another key; copy the swarm's key file to it "
                "(--secret-file), or check the one given here",
            )
        ]
    cause = _CAUSES.get(probe.refusal, probe.detail or probe.refusal or "no answer")
    return [Verdict("FAIL", "key", f"{_name(m)} refuses this machine's probe frame: {cause}")]


def clock(m: MemberFacts, observed: Observed) -> list[Verdict]:
    """The member's frames' clock against this machine's: beyond the window behind, or the
    allowance ahead (the smaller), frames between machines this far apart are refused."""
    if m.clock_offset_s is None:
        return []
    node = m.status.node if m.status is not None else None
    window = (node.clock_window_s if node is not None else None) or 30.0
    if node is not None and node.clock_ahead_s:
        window = min(window, node.clock_ahead_s)
    offset = m.clock_offset_s
    said = f"{_name(m)}: its clock is {offset:+.1f} s from this machine's"
    if abs(offset) > window:
        return [
            Verdict(
                "FAIL",
                "clock",
                f"{said}, beyond the frames' window of {window:g} s: "
                "its peers refuse its frames; run NTP on it (timedatectl set-ntp true)",
            )
        ]
    if abs(offset) > CLOCK_WARN_SHARE * window:
        return [
            Verdict(
                "warn", "clock", f"{said}, near the frames' window of {window:g} s: run NTP on it"
            )
        ]
    return [Verdict("ok", "clock", f"{said} (window {window:g} s)")]


def duplicates(members: Iterable[MemberFacts]) -> list[Verdict]:
    """Two members that advertise one address: peers reach at most one of them there (a
    bridge address such as docker0's, the same on every host, is the usual cause)."""
    by_address: dict[str, list[str]] = defaultdict(list)
    for m in members:
        by_address[m.row.address].append(m.row.id)
    verdicts = []
    for at, ids in sorted(by_address.items()):
        if len(ids) > 1:
            verdicts.append(
                Verdict(
                    "FAIL",
                    "duplicate_address",
                    f"{' and '.join(sorted(ids))} "
                    f"all advertise {at} (a bridge address such as docker0's, "
                    "the same on each host?): start each with --advertise its "
                    "own LAN address",
                )
            )
    if not verdicts:
        verdicts.append(
            Verdict("ok", "duplicate_address", "every member advertises its own address")
        )
    return verdicts


def refused(observed: Observed) -> list[Verdict]:
    """Frames a member refused for a cause an admin can fix, naming the peer and the cause;
    the doctor's own probes (from this machine) are left out."""
    hosts = {split_host_port(m.row.address)[0]: m.row.id for m in observed.members}
    verdicts = []
    for m, row in _refusals(observed):
        if row.reason not in _CAUSES or row.peer in observed.own_hosts:
            continue
        peer = (
            f"{hosts[row.peer]} ({row.peer})" if row.peer in hosts else f"{row.peer} (not a member)"
        )
        recent = row.last_s_ago <= RECENT_REFUSAL_S
        said = (
            f"{m.row.id} refused {row.count} {row.what} frame(s) from {peer}, the last "
            f"{row.last_s_ago:.0f} s ago: {_CAUSES[row.reason]}"
        )
        verdicts.append(Verdict("FAIL" if recent else "warn", "refused", said))
    if not verdicts:
        verdicts.append(
            Verdict("ok", "refused", "no member refuses frames for a wrong key, clock or version")
        )
    return verdicts


def _refusals(observed: Observed) -> list[tuple[MemberFacts, RefusedPeer]]:
    return [
        (m, row) for m in observed.members if m.status is not None for row in m.status.refused_from
    ]


def coverage(observed: Observed) -> list[Verdict]:
    """Every layer of each model the members serve is served by a live member, as each
    member that answered sees it (the asked node first)."""
    by_model: dict[str, list[NodeStatus]] = defaultdict(list)
    for status in _statuses(observed):
        by_model[status.model.id].append(status)
    verdicts = []
    for statuses in by_model.values():
        model = statuses[0].model
        name = f"model {model.name} ({model.id[:12]})"
        short = [s for s in statuses if not s.coverage.complete]
        if not short:
            verdicts.append(Verdict("ok", "coverage", f"{name}: all {model.layers} layers served"))
            continue
        gaps = ", ".join(f"{a}:{b}" for a, b in short[0].coverage.missing)
        verdicts.append(
            Verdict(
                "FAIL",
                "coverage",
                f"{name}: layers {gaps} served by no live member (as {short[0].node.id} sees "
                f"it): start a node with --model {model.id[:12]}, or give the nodes that serve "
                "it more memory (--layer-memory-bytes)",
            )
        )
    return verdicts


def _statuses(observed: Observed) -> list[NodeStatus]:
    """The asked node's status first, then each member's own."""
    own = [m.status for m in observed.members if m.status is not None]
    return [s for s in (observed.status, *own) if s is not None]


def failed(verdicts: Iterable[Verdict]) -> bool:
    return any(v.level == "FAIL" for v in verdicts)
