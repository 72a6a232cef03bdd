"""The spot-checks' decisions (swarm/inference/spot_checks.py): which steps are checked,
at what rate, which hop a shadow route leaves out, and whose result is wrong."""

from __future__ import annotations

import pytest
import torch

from swarm.errors import ConfigError
from swarm.inference.spot_checks import (
    Conviction,
    Convictions,
    Outcome,
    Result,
    check_every,
    check_order,
    lifted,
    reload_refusal,
    sampled,
    third_route_excludes,
    verdict,
)
from swarm.runtime.execution.faults import flip_byte
from swarm.runtime.weights.packed import PackedTensor
from swarm.types import LayerSpan, NodeId

A, B, C, D, E = (NodeId(n) for n in "abcde")


def run(route: str, output: bytes) -> Result:
    return Result(frozenset(NodeId(n) for n in route), output)


@pytest.mark.parametrize(
    ("every", "expected"),
    [(0, 0), (1, 1000), (-3, 0)],
)
def test_none_or_every_step_is_sampled(every: int, expected: int) -> None:
    assert sum(sampled("s", p, every) for p in range(1000)) == expected


@pytest.mark.parametrize("every", [2, 10, 200])
def test_one_step_in_every_is_sampled_on_average_and_the_same_each_time(every: int) -> None:
    picks = [sampled(f"session-{s}", p, every) for s in range(40) for p in range(500)]
    share = sum(picks) / len(picks)
    assert 0.8 / every < share < 1.2 / every
    assert picks == [sampled(f"session-{s}", p, every) for s in range(40) for p in range(500)]


@pytest.mark.parametrize(
    ("route", "flagged", "every", "every_flagged", "expected"),
    [
        ([A, B], set(), 200, 10, 200),  # nobody flagged: the base rate
        ([A, B], {B}, 200, 10, 10),  # a flagged hop on the route: the higher rate
        ([A, B], {C}, 200, 10, 200),  # flagged, but not on this route
        ([A, B], {B}, 0, 10, 0),  # checks off: off for flagged members too
        ([A, B], {A}, 5, 10, 5),  # never less often than the base rate
        ([], {A}, 200, 10, 200),  # a first step, before its route is known
    ],
)
def test_the_rate_rises_for_a_route_through_a_flagged_member(
    route: list[NodeId], flagged: set[NodeId], every: int, every_flagged: int, expected: int
) -> None:
    assert check_every(route, flagged, every, every_flagged) == expected


@pytest.mark.parametrize(
    ("hops", "flagged", "position", "expected"),
    [
        ([A, B, C], set(), 0, [0, 1, 2]),
        ([A, B, C], set(), 1, [1, 2, 0]),
        ([A, B, C], set(), 5, [2, 0, 1]),  # each hop in turn as positions go by
        ([A, B, C], {C}, 0, [2, 0, 1]),  # a flagged hop first
        ([A, B, C], {A, C}, 1, [2, 0, 1]),
        ([A], set(), 7, [0]),
        ([], set(), 3, []),
    ],
)
def test_which_hop_a_shadow_route_leaves_out(
    hops: list[NodeId], flagged: set[NodeId], position: int, expected: list[int]
) -> None:
    assert check_order(hops, flagged, position) == expected


@pytest.mark.parametrize(
    ("results", "outcome", "members"),
    [
        ([run("ab", b"x"), run("ac", b"x")], Outcome.AGREE, ""),
        ([run("ab", b"x"), run("ac", b"y")], Outcome.UNDECIDED, "bc"),  # evidence only
        ([run("ab", b"x"), run("ac", b"y"), run("ad", b"y")], Outcome.CONVICTED, "b"),
        ([run("ab", b"x"), run("ac", b"y"), run("ad", b"x")], Outcome.CONVICTED, "c"),
        ([run("ab", b"x"), run("ac", b"y"), run("ad", b"z")], Outcome.UNDECIDED, "bcd"),
        # the minority's every member also ran in the majority: a fault that comes and goes
        ([run("ab", b"x"), run("ab", b"y"), run("ab", b"y")], Outcome.UNDECIDED, ""),
        # the shadow swapped two hops; the third run agrees with the live one
        ([run("ab", b"x"), run("cd", b"y"), run("eb", b"x")], Outcome.CONVICTED, "cd"),
        ([run("b", b"x"), run("c", b"y"), run("d", b"y")], Outcome.CONVICTED, "b"),
    ],
)
def test_the_verdict_from_two_or_three_runs(
    results: list[Result], outcome: Outcome, members: str
) -> None:
    found = verdict(results)
    assert found.outcome is outcome
    assert found.members == frozenset(NodeId(n) for n in members)


@pytest.mark.parametrize(
    ("live", "shadow", "expected"),
    [("ab", "ac", "bc"), ("ab", "cd", "abcd"), ("abc", "adc", "bd")],
)
def test_a_deciding_run_leaves_out_the_members_the_two_do_not_share(
    live: str, shadow: str, expected: str
) -> None:
    got = third_route_excludes(run(live, b"").route, run(shadow, b"").route)
    assert got == frozenset(NodeId(n) for n in expected)


@pytest.mark.parametrize(
    ("conviction", "standing", "reloads", "expected"),
    [
        (Conviction(0), True, 0, False),  # still the layers it was convicted on
        (Conviction(0), True, 1, True),  # it reloaded them since
        (Conviction(2), True, 2, False),  # its earlier reloads do not count
        (Conviction(2), True, 3, True),
        (Conviction(0), False, 1, False),  # reloaded, but gone from the view now
        (Conviction(0, gone=True), False, 0, False),  # gone: still convicted
        (Conviction(0, gone=True), True, 0, True),  # gone and back: it started again
        (Conviction(4, gone=True), True, 0, True),  # a new process counts from 0
    ],
)
def test_a_conviction_is_lifted_by_a_restart_or_a_newer_reload(
    conviction: Conviction, standing: bool, reloads: int, expected: bool
) -> None:
    assert lifted(conviction, standing, reloads) is expected


def test_a_convicted_member_is_left_out_until_it_starts_again_then_flagged() -> None:
    convictions = Convictions()
    assert convictions.convict(B, 0)  # newly: it is asked to reload
    assert not convictions.convict(B, 0)  # a second verdict on it asks nothing more
    assert convictions.current({A: 0, B: 0}) == {B}
    assert convictions.current({A: 0, B: 0}) == {B}  # a refuted suspicion is not a new start
    assert convictions.current({A: 0}) == {B}  # gone from the view: still convicted
    assert convictions.current({A: 0}) == {B}
    assert convictions.current({A: 0, B: 0}) == frozenset()  # back: it started again
    assert B in convictions.flagged
    assert convictions.current({A: 0, B: 0}) == frozenset()


def test_a_convicted_member_is_let_back_in_once_it_announces_a_reload() -> None:
    convictions = Convictions()
    convictions.convict(B, 1)
    assert convictions.current({A: 0, B: 1}) == {B}
    assert convictions.current({A: 0, B: 2}) == frozenset()  # reloaded: back in, flagged
    assert B in convictions.flagged
    # a verdict on a step run before that reload (a check that was under way) is lifted
    # by it at once; one on a step run after it holds until the next reload
    convictions.convict(B, 1)
    assert convictions.current({A: 0, B: 2}) == frozenset()
    convictions.convict(B, 2)
    assert convictions.current({A: 0, B: 2}) == {B}
    assert not convictions.convict(B, 1)  # a late verdict never lowers what lifts it
    assert convictions.current({A: 0, B: 2}) == {B}
    assert convictions.current({A: 0, B: 3}) == frozenset()


SPAN, OTHER = LayerSpan(15, 30), LayerSpan(0, 15)


@pytest.mark.parametrize(
    ("member", "span", "reloaded_at", "now", "refused"),
    [
        (True, SPAN, {}, 100.0, None),  # a first reload
        (False, SPAN, {}, 100.0, "the asker is not a member"),
        (True, None, {}, 100.0, "this node serves no layers"),
        (True, SPAN, {SPAN: 50.0}, 100.0, "layers 15:30 were reloaded 50 s ago"),
        (True, SPAN, {SPAN: 50.0}, 649.0, "at most once in 600 s"),
        (True, SPAN, {SPAN: 50.0}, 650.0, None),  # the interval has passed
        (True, SPAN, {OTHER: 90.0}, 100.0, None),  # it moved since: another span
    ],
)
def test_a_reload_is_refused_to_a_stranger_and_more_than_once_per_span_in_the_interval(
    member: bool,
    span: LayerSpan | None,
    reloaded_at: dict[LayerSpan, float],
    now: float,
    refused: str | None,
) -> None:
    why = reload_refusal(member, span, reloaded_at, now, 600.0)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


def test_a_flipped_byte_changes_one_byte_of_a_copy() -> None:
    plain = torch.arange(4, dtype=torch.float32)  # 16 bytes
    packed = PackedTensor("q8_0", torch.zeros(2, 34, dtype=torch.uint8), 32)
    weights = {"b.weight": packed, "a.weight": plain}
    flipped = flip_byte(weights, 16 + 35, 7)  # the 36th byte of the second in name order
    changed = flipped["b.weight"]
    assert isinstance(changed, PackedTensor)
    assert changed.data.view(-1).tolist() == [0] * 35 + [255] + [0] * 32
    assert packed.data.sum() == 0 and flipped["a.weight"] is plain
    assert flip_byte(weights, 2, 7)["a.weight"].view(torch.uint8)[2] != plain.view(torch.uint8)[2]


def test_a_flipped_byte_past_the_layer_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="offset 16 is past layer 7's 16 bytes"):
        flip_byte({"a.weight": torch.zeros(4)}, 16, 7)
