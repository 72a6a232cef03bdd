"""`swarm doctor`'s checks as a table: for each fault, what was observed and the one line it
gives (level, check, and the words that name the cause and the fix)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harness.factories import member
from swarm.doctor import as_json, as_lines, diagnose, failed
from swarm.doctor.facts import Connect, KeyProbe, MemberFacts, Observed, Verdict
from swarm.membership.subsystem import member_row
from swarm.schema import Coverage, ModelInfo, NodeInfo, NodeStatus, RefusedPeer

OK_HTTP = Connect(7420, "ok")
OK_FAST = Connect(7421, "ok")


def row(name: str, state: str = "alive", **fields: Any) -> Any:
    record = member(name, address=fields.pop("address", f"10.0.0.{ord(name[-1]) % 200}:7420"))
    return dataclasses.replace(member_row(record, state, None), **fields)


def status(name: str, *rows: Any, missing: tuple[tuple[int, int], ...] = (), **node: Any) -> Any:
    me = row(name)
    refused = node.pop("refused_from", ())
    info = NodeInfo(name, me.address, None, **{"address_because": "--advertise", **node})
    return NodeStatus(
        node=info,
        model=ModelInfo("tiny", "m" * 64, 8),
        members=(me, *rows),
        coverage=Coverage(not missing, missing, 8, 1.0),
        refused_from=refused,
    )


def facts(name: str, **changes: Any) -> MemberFacts:
    base = MemberFacts(row(name), OK_HTTP, OK_FAST, status(name), clock_offset_s=0.2)
    return dataclasses.replace(base, **changes)


def observe(*members: MemberFacts, **changes: Any) -> Observed:
    observed = Observed("10.0.0.97:7420", members[0].status, members=members)
    return dataclasses.replace(observed, **changes)


def verdicts_of(observed: Observed, check: str) -> list[Verdict]:
    return [v for v in diagnose(observed) if v.check == check]


def test_a_healthy_swarm_is_all_ok_and_exits_zero() -> None:
    a, b = facts("a"), facts("b")
    verdicts = diagnose(observe(a, b))
    assert {v.level for v in verdicts} == {"ok"}, as_lines(verdicts)
    checks = {v.check for v in verdicts}
    assert checks == {
        "reach", "fast_port", "reach_back", "address", "clock", "duplicate_address",
        "refused", "coverage",
    }  # fmt: skip
    assert not failed(verdicts)
    assert '"ok": true' in as_json(verdicts)


def test_a_node_that_does_not_answer_is_one_line() -> None:
    [verdict] = diagnose(Observed("10.0.0.9:7420", None, "connection refused"))
    assert verdict.level == "FAIL" and verdict.check == "node"
    assert "10.0.0.9:7420 does not answer: connection refused" in verdict.message
    assert len(as_lines([verdict])) == 1 and "\n" not in as_lines([verdict])[0]


CASES = [
    # (what is wrong, the member's facts, the check, its level, words the line must hold)
    (
        "http port times out",
        dict(http=Connect(7420, "timeout"), fast=None, status=None),
        "reach", "FAIL", ["no answer on port 7420 within 2 s", "ufw allow 7420/tcp"],
    ),
    (
        "http port refused",
        dict(http=Connect(7420, "refused"), fast=None, status=None),
        "reach", "FAIL", ["refuses connections"],
    ),
    (
        "no route",
        dict(http=Connect(7420, "unreachable", "No route to host"), fast=None, status=None),
        "reach", "FAIL", ["no route to port 7420", "--advertise"],
    ),
    (
        "a dead member that does not answer",
        dict(row=row("b", "dead"), http=Connect(7420, "refused"), fast=None, status=None),
        "reach", "warn", ["is dead", "gone?"],
    ),
    (
        "fast port dropped by a firewall",
        dict(fast=Connect(7421, "timeout")),
        "fast_port", "FAIL",
        ["HTTP answers but fast", "port 7421", "ufw allow 7420:7421/tcp", "firewall-cmd"],
    ),
    (
        "a fast port the system picked, refused",
        dict(fast=Connect(40111, "refused")),
        "fast_port", "FAIL", ["ufw allow 40111/tcp"],
    ),
    (
        "no fast port",
        dict(fast=None),
        "fast_port", "warn", ["no fast port"],
    ),
    (
        "it says peers' messages do not arrive",
        dict(status=status("b", reachable_by_peers=False)),
        "reach_back", "FAIL", ["none of theirs arrive", "though this machine reaches it"],
    ),
    (
        "a probe sealed with another key",
        dict(key_probe=KeyProbe(False, "wrong_key", "authentication tag does not match")),
        "key", "FAIL", ["another key", "--secret-file"],
    ),
    (
        "a probe outside the clock window",
        dict(key_probe=KeyProbe(False, "clock", "sealed -61 s")),
        "key", "FAIL", ["clocks apart", "NTP"],
    ),
    (
        "a probe of another protocol version",
        dict(key_probe=KeyProbe(False, "version")),
        "key", "FAIL", ["same swarm version"],
    ),
    (
        "a probe taken",
        dict(key_probe=KeyProbe(True)),
        "key", "ok", ["takes frames sealed with this secret"],
    ),
    (
        "a clock a minute ahead",
        dict(clock_offset_s=61.0),
        "clock", "FAIL", ["+61.0 s", "window of 30 s", "timedatectl set-ntp true"],
    ),
    (
        "a clock 3 s ahead of a node that takes frames at most 2 s ahead of its own",
        dict(clock_offset_s=3.0, status=status("b", clock_window_s=30.0, clock_ahead_s=2.0)),
        "clock", "FAIL", ["+3.0 s", "window of 2 s", "timedatectl set-ntp true"],
    ),
    (
        "a clock 20 s behind",
        dict(clock_offset_s=-20.0),
        "clock", "warn", ["-20.0 s", "near the frames' window"],
    ),
    (
        "why it advertises its address",
        dict(status=status("b", address_because="the route to the bootstrap peer 10.0.0.97:7420")),
        "address", "ok", ["advertises 10.0.0.98:7420 (the route to the bootstrap peer"],
    ),
    (
        "layers nobody serves",
        dict(status=status("b", missing=((2, 4), (6, 8)))),
        "coverage", "FAIL", ["layers 2:4, 6:8 served by no live member", "--model mmmmmmmmmmmm"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "changes", "check", "level", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_each_fault_is_one_line_with_its_fix(
    what: str, changes: dict[str, Any], check: str, level: str, words: list[str]
) -> None:
    observed = observe(facts("a"), facts("b", **changes))
    found = [
        v
        for v in verdicts_of(observed, check)
        if v.level == level and not v.message.startswith("a ")
    ]
    assert len(found) == 1, as_lines(diagnose(observed))
    for word in words:
        assert word in found[0].message, found[0].message
    assert failed(diagnose(observed)) == (level == "FAIL")


@pytest.mark.parametrize("seen_as", ["suspect", "dead"])
def test_a_member_others_doubt_while_this_machine_reaches_it(seen_as: str) -> None:
    view_of_b = row("b", seen_as)
    a = facts("a", status=status("a", view_of_b))
    [verdict] = [
        v for v in verdicts_of(observe(a, facts("b")), "reach_back") if "b at" in v.message
    ]
    assert verdict.level == "FAIL"
    assert f"a sees it {seen_as}" in verdict.message
    assert "a firewall on it for their addresses" in verdict.message


def test_a_member_another_cannot_send_to_is_doubted_too() -> None:
    a = facts("a", status=status("a", row("b", reachable=False)))
    messages = [v.message for v in verdicts_of(observe(a, facts("b")), "reach_back")]
    assert any("a sees it unreachable" in m for m in messages), messages


def test_two_members_at_one_address() -> None:
    shared = "172.17.0.1:7420"
    b, c = (facts(n, row=row(n, "suspect", address=shared)) for n in "bc")
    [verdict] = verdicts_of(observe(facts("a"), b, c), "duplicate_address")
    assert verdict.level == "FAIL"
    assert f"b and c all advertise {shared}" in verdict.message
    assert "docker0" in verdict.message and "--advertise" in verdict.message


REFUSED = [
    ("wrong_key", "another swarm secret"),
    ("clock", "run NTP on both"),
    ("version", "same swarm version"),
    ("misaddressed", "two nodes answer at one address"),
]


@pytest.mark.parametrize(("reason", "words"), REFUSED)
def test_refused_frames_name_the_peer_and_the_cause(reason: str, words: str) -> None:
    refusals = (
        RefusedPeer("10.0.0.98", reason, "gossip", 12, 3.0),  # member b's host
        RefusedPeer("10.0.0.55", reason, "a link", 2, 900.0),  # a stranger, long ago
        RefusedPeer("10.0.0.97", reason, "gossip", 1, 1.0),  # this machine's own probe
        RefusedPeer("10.0.0.55", "bad_frame", "gossip", 5, 1.0),  # noise: no fix to name
    )
    a = facts("a", status=status("a", refused_from=refusals))
    observed = observe(a, facts("b"), own_hosts=frozenset({"10.0.0.97"}))
    recent, old = verdicts_of(observed, "refused")
    assert recent.level == "FAIL"
    assert "a refused 12 gossip frame(s) from b (10.0.0.98), the last 3 s ago" in recent.message
    assert words in recent.message
    assert old.level == "warn" and "10.0.0.55 (not a member)" in old.message


def test_the_report_is_one_line_per_verdict_level_first() -> None:
    lines = as_lines([Verdict("FAIL", "fast_port", "x"), Verdict("ok", "reach", "y")])
    assert lines[0].startswith("FAIL fast_port") and lines[1].startswith("ok   reach")
