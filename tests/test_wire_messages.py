"""Domain messages through real frames: round trips, tolerance of unknown and missing optional
fields, refusal of malformed ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.frames import now_us
from swarm.errors import FrameError
from swarm.inference.hop_core import onward
from swarm.schema import HopTimes
from swarm.types import LayerSpan, SessionId
from swarm.wire import (
    CloseSession,
    Codec,
    ErrorCode,
    ErrorMessage,
    FrameCodec,
    Hop,
    Message,
    MessageType,
    NodeId,
    Peer,
    ProbeReply,
    ReloadLayers,
    ResultMessage,
    StepMessage,
    SwarmKeys,
    generate_secret,
)
from swarm.wire.frame import seal_frame

KEYS = SwarmKeys.derive(generate_secret())
ENTRY = Peer(NodeId("entry"), "10.0.0.9:7070")
ROUTE = (
    Hop(NodeId("n1"), "10.0.0.1:7070", LayerSpan(0, 10)),
    Hop(NodeId("n2"), "[fe80::2]:7070", LayerSpan(10, 20)),
    Hop(NodeId("n3"), "n3.lan:7070", LayerSpan(20, 30)),
)
TIMINGS = (HopTimes(NodeId("n1"), 0.25, 3.5, 0.04, dispatch=0.02, resume=0.05, send=0.3),)
SESSION = SessionId("5f0c1d7e-session")


def _pair() -> tuple[FrameCodec, FrameCodec]:
    return FrameCodec(KEYS.frame, NodeId("sender")), FrameCodec(KEYS.frame, NodeId("receiver"))


def _through(message: Message) -> Message:
    sender, receiver = _pair()
    received = receiver.decode(sender.encode(message, NodeId("receiver")))
    assert received.sender == "sender"
    return received.message


def _hidden(seq: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(1, seq, 576, generator=torch.Generator().manual_seed(seq)).to(dtype)


@pytest.mark.parametrize(
    "message",
    [
        CloseSession(SESSION),
        ErrorMessage(SESSION, 7, ErrorCode.KV_CACHE_FULL, "no room", NodeId("n2")),
        ErrorMessage(SESSION, 0, ErrorCode.INTERNAL, ""),
        ErrorMessage(SESSION, 3, ErrorCode.PREFIX_MISSING, "2 of 5 held", NodeId("n2"), 2),
        ProbeReply(12),
        ReloadLayers(SESSION, 41),
    ],
)
def test_control_messages_round_trip(message: Message) -> None:
    assert _through(message) == message


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq", [1, 9])
def test_step_and_result_round_trip(codec: Codec, dtype: torch.dtype, seq: int) -> None:
    hidden = _hidden(seq, dtype)
    step = StepMessage(SESSION, 3, 40, hidden, ROUTE[1:], ENTRY, TIMINGS, codec)
    got = _through(step)
    assert isinstance(got, StepMessage) and got == step
    assert got.hidden.dtype == dtype and got.hidden.shape == hidden.shape
    result = ResultMessage(SESSION, 3, 40, hidden, TIMINGS * 3, codec)
    got_result = _through(result)
    assert isinstance(got_result, ResultMessage) and got_result == result
    for out in (got.hidden, got_result.hidden):
        if codec is Codec.RAW:
            assert torch.equal(out, hidden)
        else:
            bound = hidden.float().abs().max() / 127 * 2
            assert (out.float() - hidden.float()).abs().max() <= bound


def _sealed(message_type: int, fields: dict[str, Any], tensors: Any = ()) -> bytes:
    return seal_frame(KEYS.frame, "sender", now_us(), message_type, fields, tensors, receiver="r")


def _decode(message_type: int, fields: dict[str, Any], tensors: Any = ()) -> Message:
    return (
        FrameCodec(KEYS.frame, NodeId("r")).decode(_sealed(message_type, fields, tensors)).message
    )


def test_a_verify_step_and_its_result_say_so_and_older_frames_do_not() -> None:
    hidden = _hidden(5)
    step = StepMessage(SESSION, 4, 40, hidden, ROUTE, ENTRY, verify=True)
    got = _through(step)
    assert isinstance(got, StepMessage) and got.verify and got.hidden.shape[1] == 5
    result = _through(ResultMessage(SESSION, 4, 40, hidden, verify=True))
    assert isinstance(result, ResultMessage) and result.verify
    fields, _ = StepMessage(SESSION, 4, 40, hidden, ROUTE, ENTRY).to_wire()
    assert "verify" not in fields  # what an older peer sends and reads: nothing new
    older = _through(ResultMessage(SESSION, 4, 40, hidden[:, -1:]))
    assert isinstance(older, ResultMessage) and not older.verify


def test_a_step_that_asks_for_every_row_says_so_and_its_last_hop_returns_them_all() -> None:
    hidden = _hidden(5)
    step = StepMessage(SESSION, 0, 0, hidden, ROUTE[-1:], ENTRY, every_row=True)
    got = _through(step)
    assert isinstance(got, StepMessage) and got.every_row and got.hidden.shape[1] == 5
    fields, _ = StepMessage(SESSION, 0, 0, hidden, ROUTE, ENTRY).to_wire()
    assert "rows" not in fields  # only where asked
    result = onward(got, hidden, ())
    assert isinstance(result, ResultMessage) and result.hidden.shape[1] == 5
    plain = onward(StepMessage(SESSION, 0, 0, hidden, ROUTE[-1:], ENTRY), hidden, ())
    assert plain.hidden.shape[1] == 1


def test_unknown_fields_are_ignored_and_optional_ones_default() -> None:
    fields, tensors = StepMessage(SESSION, 1, 5, _hidden(1), ROUTE, ENTRY).to_wire()
    fields["priority"] = {"future": [1, 2.5, "x"]}
    fields["route"][0]["region"] = "attic"
    del fields["timings"]
    got = _decode(MessageType.STEP, fields, tensors)
    assert isinstance(got, StepMessage) and got.timings == () and got.route == ROUTE
    close = _decode(MessageType.CLOSE, {"session": "s", "new": True})
    assert close == CloseSession(SessionId("s"))
    error = _decode(MessageType.ERROR, {"session": "s", "step": 2, "code": 999})
    assert error == ErrorMessage(SessionId("s"), 2, ErrorCode.UNKNOWN, "")
    # A timing from a peer that only measures compute.
    step_fields, _ = StepMessage(SESSION, 1, 5, _hidden(1), ROUTE, ENTRY, TIMINGS).to_wire()
    step_fields["timings"] = [{"id": "n1", "c": 2.0}]
    got = _decode(MessageType.STEP, step_fields, tensors)
    assert isinstance(got, StepMessage)
    assert got.timings == (HopTimes(NodeId("n1"), 0.0, 2.0, 0.0),)


def _step_fields() -> tuple[dict[str, Any], Any]:
    return StepMessage(SESSION, 1, 5, _hidden(1), ROUTE, ENTRY).to_wire()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda f: f.pop("session"), "no 'session'"),
        (lambda f: f.update(session=""), "must not be empty"),
        (lambda f: f.update(session=5), "must be a string"),
        (lambda f: f.update(step=-1), "outside"),
        (lambda f: f.update(step=True), "integer"),
        (lambda f: f.update(pos=2**64 - 1), "outside"),
        (lambda f: f.update(route=[]), "route is empty"),
        (lambda f: f.update(route="n1"), "array"),
        (lambda f: f.update(route=[5]), "must be a map"),
        (lambda f: f["route"][0].update(start=10, end=5), "route hop"),
        (lambda f: f["route"].reverse(), "does not chain"),
        (lambda f: f.pop("entry"), "no 'entry'"),
        (lambda f: f.update(timings=[{"id": "x", "c": float("nan")}]), "finite"),
        (lambda f: f.update(timings=[{"id": "x", "q": -1.0}]), "finite"),
    ],
)
def test_malformed_step_fields_are_frame_errors(change: Any, reason: str) -> None:
    fields, tensors = _step_fields()
    change(fields)
    with pytest.raises(FrameError, match=reason):
        _decode(MessageType.STEP, fields, tensors)


def test_a_route_read_again_is_its_hops_kept_and_a_changed_one_is_read_anew() -> None:
    """A session's steps carry one route step after step: its hops are built once. Any field
    that differs is another route, checked as the first was."""
    fields, tensors = _step_fields()
    first = _decode(MessageType.STEP, fields, tensors)
    again = _decode(MessageType.STEP, fields, tensors)
    assert isinstance(first, StepMessage) and isinstance(again, StepMessage)
    assert first.route == ROUTE and again.route is first.route
    fields["route"][1]["addr"] = "n2.lan:7070"
    moved = _decode(MessageType.STEP, fields, tensors)
    assert isinstance(moved, StepMessage) and moved.route[1].address == "n2.lan:7070"
    fields["route"][1]["start"] = 11
    with pytest.raises(FrameError, match="does not chain"):
        _decode(MessageType.STEP, fields, tensors)
    fields["route"][1]["start"] = True  # not an integer: read the long way, refused by name
    with pytest.raises(FrameError, match="integer"):
        _decode(MessageType.STEP, fields, tensors)


def test_tensor_count_and_shape_are_checked() -> None:
    fields, tensors = _step_fields()
    with pytest.raises(FrameError, match="one tensor"):
        _decode(MessageType.STEP, fields, ())
    with pytest.raises(FrameError, match="one tensor"):
        _decode(MessageType.STEP, fields, tensors * 2)
    flat = StepMessage(SESSION, 1, 5, torch.zeros(576), ROUTE, ENTRY).to_wire()[1]
    with pytest.raises(FrameError, match=r"\[1, seq>=1, hidden\]"):
        _decode(MessageType.STEP, fields, flat)
    with pytest.raises(FrameError, match="no tensors"):
        _decode(MessageType.CLOSE, {"session": "s"}, tensors)


def test_unknown_message_type_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="unknown message type 200"):
        _decode(200, {"session": "s"})


def test_a_step_without_route_is_not_sent() -> None:
    with pytest.raises(FrameError, match="route"):
        StepMessage(SESSION, 1, 5, _hidden(1), (), ENTRY).to_wire()


def test_message_type_numbers_are_stable() -> None:
    # Append only: these numbers are on the wire.
    # 1 (open) and 9 (set slowdown) are retired and never reused.
    assert {t.name: int(t) for t in MessageType} == {
        "CLOSE": 2,
        "STEP": 3,
        "RESULT": 4,
        "ERROR": 5,
        "GOSSIP": 6,
        "PROBE": 7,
        "PROBE_REPLY": 8,
        "HELLO": 10,
        "RELOAD": 11,
    }
    assert [int(c) for c in Codec] == [0, 1, 2, 3]
    assert ErrorCode.UNKNOWN == 0 and ErrorCode.HOP_UNREACHABLE == 8
    assert not {7, 9, 10} & {int(c) for c in ErrorCode}  # retired codes are never reused


def test_a_first_step_names_its_kept_blocks_and_a_chunk_its_own_and_bad_digests_are_refused() -> (
    None
):
    hidden = _hidden(4)
    digests = ("0" * 32, "a" * 32)
    step = StepMessage(SESSION, 1, 8, hidden, ROUTE, ENTRY, prefix=digests, block="f" * 32)
    got = _through(step)
    assert isinstance(got, StepMessage) and got.prefix == digests and got.block == "f" * 32
    fields, tensors = StepMessage(SESSION, 1, 8, hidden, ROUTE, ENTRY).to_wire()
    assert "prefix" not in fields and "block" not in fields  # as an older peer sends it
    for bad in (["short"], ["G" * 32], [7]):
        with pytest.raises(FrameError, match="hex digest"):
            _decode(MessageType.STEP, {**fields, "prefix": bad}, tensors)
