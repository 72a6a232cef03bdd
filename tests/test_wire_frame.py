"""The frame envelope: compression, authentication, replay, limits and bombs."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import lz4.block
import msgpack
import pytest
import torch

from harness.frames import KEYS, craft, now_us
from swarm.errors import FrameError
from swarm.types import LayerSpan, SessionId
from swarm.wire import (
    CloseSession,
    Codec,
    FrameCodec,
    Hop,
    NodeId,
    Peer,
    StepMessage,
    SwarmKeys,
    WireLimits,
    activation_limits,
    generate_secret,
)
from swarm.wire.frame import FLAG_LZ4, seal_envelope, seal_frame

MIB = 1024 * 1024
ROUTE = (Hop(NodeId("n1"), "10.0.0.1:7070", LayerSpan(0, 30)),)
ENTRY = Peer(NodeId("e"), "10.0.0.9:7070")
RX = NodeId("receiver")


def receiver(**limits: Any) -> FrameCodec:
    return FrameCodec(KEYS.frame, NodeId("receiver"), WireLimits(**limits))


def step(hidden: torch.Tensor, codec: Codec = Codec.RAW) -> StepMessage:
    return StepMessage(SessionId("s"), 0, 0, hidden, ROUTE, ENTRY, (), codec)


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes Python, numpy and lz4 allocate while fn runs (FrameError expected)."""
    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(FrameError):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_lz4_only_when_it_makes_the_frame_smaller() -> None:
    sender = FrameCodec(KEYS.frame, NodeId("s"))
    zeros = sender.encode(step(torch.zeros(1, 64, 576)), RX)
    assert zeros[3] & FLAG_LZ4 and len(zeros) < 64 * 576 * 4 // 10
    noise = sender.encode(step(torch.randn(1, 64, 576)), RX)
    assert not noise[3] & FLAG_LZ4 and len(noise) > 64 * 576 * 4
    plain = sender.encode(step(torch.zeros(1, 64, 576)), RX, compress=False)
    assert not plain[3] & FLAG_LZ4
    rx = receiver()
    for frame in (zeros, noise, plain):
        assert isinstance(rx.decode(frame).message, StepMessage)


def test_every_flipped_bit_is_refused() -> None:
    frame = FrameCodec(KEYS.frame, NodeId("s")).encode(CloseSession(SessionId("s")), RX)
    rx = receiver()
    for i in range(len(frame)):
        for bit in range(8):
            bad = bytearray(frame)
            bad[i] ^= 1 << bit
            with pytest.raises(FrameError):
                rx.decode(bytes(bad))
    rx.decode(frame)  # the untouched frame still passes: nothing above marked it seen


def test_wrong_key_and_wrong_purpose_are_refused() -> None:
    message = CloseSession(SessionId("s"))
    other = SwarmKeys.derive(generate_secret())
    for key in (other.frame, KEYS.gossip):
        frame = FrameCodec(key, NodeId("s")).encode(message, RX)
        with pytest.raises(FrameError, match="tag does not match"):
            receiver().decode(frame)


def test_replays_are_refused_and_new_counters_pass() -> None:
    sender, rx = FrameCodec(KEYS.frame, NodeId("s")), receiver()
    first = sender.encode(CloseSession(SessionId("a")), RX)
    second = sender.encode(CloseSession(SessionId("b")), RX)
    assert rx.decode(second).counter > 0
    rx.decode(first)  # out of order, inside the window
    for frame in (first, second):
        with pytest.raises(FrameError, match="replay"):
            rx.decode(frame)
    restarted = FrameCodec(KEYS.frame, NodeId("s"))  # counters continue from the clock
    assert rx.decode(restarted.encode(CloseSession(SessionId("c")), RX)).sender == "s"


def test_the_tag_is_checked_before_decompressing() -> None:
    bomb = lz4.block.compress(bytes(8 * MIB), store_size=False)
    frame = bytearray(craft(bomb, header_len=10, raw_len=8 * MIB, flags=FLAG_LZ4))
    frame[-1] ^= 1
    rx = receiver(max_body_bytes=16 * MIB)
    assert peak_bytes(lambda: rx.decode(bytes(frame))) < MIB
    with pytest.raises(FrameError, match="tag"):
        rx.decode(bytes(frame))
    with pytest.raises(FrameError, match="lz4"):
        rx.decode(craft(b"\xff" * 50, header_len=10, raw_len=100, flags=FLAG_LZ4, counter=2))


@pytest.fixture(scope="module")
def lz4_bomb() -> bytes:
    """64 MiB of zeros, about 250 KiB compressed."""
    return bytes(lz4.block.compress(bytes(64 * MIB), store_size=False))


def test_lz4_bomb_declared_honestly_is_refused_before_decompressing(lz4_bomb: bytes) -> None:
    rx = receiver(max_body_bytes=8 * MIB)
    frame = craft(lz4_bomb, header_len=16, raw_len=64 * MIB, flags=FLAG_LZ4)
    assert len(frame) < MIB
    assert peak_bytes(lambda: rx.decode(frame)) < MIB
    with pytest.raises(FrameError, match="over the limit"):
        rx.decode(frame)


def test_lz4_bomb_that_lies_about_its_size_stops_at_the_declared_size(lz4_bomb: bytes) -> None:
    rx = receiver(max_body_bytes=8 * MIB)
    frames = iter(
        craft(lz4_bomb, header_len=16, raw_len=raw, flags=FLAG_LZ4, counter=i)
        for i, raw in enumerate([MIB, 8 * MIB], start=1)
    )
    for cap in (MIB, 8 * MIB):
        frame = next(frames)
        assert peak_bytes(lambda frame=frame: rx.decode(frame)) < cap + MIB


MSGPACK_BOMBS = {
    "array32": b"\xdd\xff\xff\xff\xff",
    "map32": b"\xdf\xff\xff\xff\xff",
    "str32": b"\xdb\xff\xff\xff\xff",
    "bin32": b"\xc6\xff\xff\xff\xff",
    "ext": b"\xc7\x08\x05" + bytes(8),
    "timestamp": b"\xd6\xff" + bytes(4),
    "nested": b"\x91" * 60_000 + b"\xc0",
    "many maps": b"\xdc\x03\xff" + b"\x80" * 1023,  # 1023 items declared, over max_array_len
    "trailing": b"\x80\x80",
    "int key": b"\x81\x01\x02",
}


@pytest.mark.parametrize("name", list(MSGPACK_BOMBS))
def test_msgpack_bombs_are_refused_in_little_memory(name: str) -> None:
    header = MSGPACK_BOMBS[name]
    # both receivers start before the frame is sealed: a frame sealed more than a second before
    # its receiver started is refused as a replay, and the measurement can take that long
    rx, again = receiver(max_array_len=1000), receiver(max_array_len=1000)
    frame = craft(header, header_len=len(header))
    assert peak_bytes(lambda: rx.decode(frame)) < MIB
    with pytest.raises(FrameError, match="msgpack"):
        again.decode(frame)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: craft(b"\x80", header_len=1, version=1), "version 1"),
        (lambda: craft(b"\x80", header_len=1, flags=0x80), "flags"),
        (lambda: craft(b"\x80", header_len=0), "header length"),
        (lambda: craft(b"\x80", header_len=2), "header length"),
        (lambda: craft(b"\x80", header_len=1, raw_len=5), "raw length"),
        (lambda: craft(b"\x80", header_len=1, sender=b"\xff"), "UTF-8"),
        (lambda: craft(b"\x80", header_len=1, sender=b""), "do not add up"),
        (lambda: craft(b"\x80", header_len=1)[:-1], "do not add up"),
        (lambda: craft(b"\x80", header_len=1) + b"x", "do not add up"),
        (lambda: b"XX" + craft(b"\x80", header_len=1)[2:], "magic"),
        (lambda: b"SW", "too short"),
        (lambda: "not bytes", "must be bytes"),
        (lambda: craft(b"\x07", header_len=1), "header must be a map"),
        (lambda: craft(b"\x81\xa1t\x05", header_len=4), "array"),
        (lambda: craft(b"\x80", header_len=1), "no 'm'"),
    ],
)
def test_malformed_envelopes_are_frame_errors(make: Callable[[], Any], reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        receiver().decode(make())


def _specs_frame(specs: list[dict[str, Any]], payload: bytes = b"") -> bytes:
    header = msgpack.packb({"m": {"session": "s"}, "t": specs})
    return seal_envelope(
        KEYS.frame, "mallory", now_us(), 2, header, [payload], compress=False, receiver=RX
    )


@pytest.mark.parametrize(
    ("spec", "payload", "reason"),
    [
        ({"dtype": "int64", "shape": [1], "codec": 0, "nbytes": 8}, 8, "not allowed"),
        ({"dtype": "float32", "shape": [1] * 5, "codec": 0, "nbytes": 4}, 4, "rank"),
        ({"dtype": "float32", "shape": [2**40], "codec": 0, "nbytes": 4}, 4, "dimension over"),
        ({"dtype": "float32", "shape": [-1], "codec": 0, "nbytes": 4}, 4, "dimensions"),
        ({"dtype": "float32", "shape": [1.5], "codec": 0, "nbytes": 4}, 4, "dimensions"),
        ({"dtype": "float32", "shape": [1], "codec": 9, "nbytes": 4}, 4, "codec 9"),
        ({"dtype": "float32", "shape": [2], "codec": 0, "nbytes": 4}, 4, "needs 8"),
        ({"dtype": "float32", "shape": [2], "codec": 0, "nbytes": 8}, 4, "past the end"),
        ({"dtype": "float32", "shape": [1], "codec": 0, "nbytes": 4}, 5, "after the last"),
    ],
)
def test_tensor_specs_are_checked_against_limits(spec: Any, payload: int, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        receiver().decode(_specs_frame([spec], bytes(payload)))


def test_size_limits() -> None:
    sender = FrameCodec(KEYS.frame, NodeId("s"))
    big = sender.encode(step(torch.randn(1, 100, 576)), RX)
    with pytest.raises(FrameError, match="over the limit"):
        receiver(max_frame_bytes=len(big) - 1).decode(big)
    with pytest.raises(FrameError, match="over the limit"):
        receiver(max_frame_bytes=1000).decode(bytes(1001))  # refused before reading it
    with pytest.raises(FrameError, match="over the limit"):
        receiver(max_body_bytes=len(big) // 2).decode(big)
    with pytest.raises(FrameError, match="header of"):
        receiver(max_header_bytes=16).decode(big)
    with pytest.raises(FrameError, match="elements"):
        receiver(max_tensor_elements=100 * 576 - 1).decode(big)
    with pytest.raises(FrameError, match="tensors"):
        receiver(max_tensors=1).decode(_specs_frame([{}, {}]))
    with pytest.raises(FrameError, match="over the limit"):
        FrameCodec(KEYS.frame, NodeId("s"), WireLimits(max_frame_bytes=1000)).encode(
            step(torch.randn(1, 100, 576)), RX
        )
    with pytest.raises(FrameError, match="sender id"):
        seal_frame(KEYS.frame, "x" * 256, 1, 2, {})
    with pytest.raises(FrameError, match="envelope"):
        seal_frame(KEYS.frame, "x", 2**64, 2, {})
    with pytest.raises(FrameError, match="cannot pack"):
        sender.encode(StepMessage(SessionId("s"), 2**70, 0, torch.ones(1, 1, 8), ROUTE, ENTRY), RX)


def test_a_links_limits_take_a_full_prefill_chunk_and_not_one_token_more() -> None:
    hidden, chunk = 64, 16
    limits = activation_limits(hidden, chunk, WireLimits())
    route = tuple(
        Hop(NodeId(f"node-{i:04d}"), f"10.0.{i}.1:7070", LayerSpan(i, i + 1)) for i in range(64)
    )
    step = StepMessage(SessionId("s"), 0, 0, torch.randn(1, chunk, hidden), route, ENTRY)
    sender = FrameCodec(KEYS.frame, NodeId("e"), limits)
    frame = sender.encode(step, RX, compress=False)  # a long route: a big header too
    receiver = FrameCodec(KEYS.frame, RX, limits)
    assert receiver.decode(frame).message == step
    assert limits.max_frame_bytes < len(frame) + 2 * limits.max_header_bytes
    longer = StepMessage(SessionId("s"), 0, 0, torch.randn(1, chunk + 1, hidden), route, ENTRY)
    with pytest.raises(FrameError, match="over the limit"):
        receiver.decode(FrameCodec(KEYS.frame, NodeId("e")).encode(longer, RX))


def test_the_node_keeps_decoding_after_bad_frames() -> None:
    sender, rx = FrameCodec(KEYS.frame, NodeId("s")), receiver()
    junk: Iterator[bytes] = iter([b"", bytes(100), b"SW" + bytes(200)])
    for frame in junk:
        with pytest.raises(FrameError):
            rx.decode(frame)
    got = rx.decode(sender.encode(step(torch.ones(1, 1, 576), Codec.INT8_BLOCK64), RX))
    assert isinstance(got.message, StepMessage) and torch.equal(
        got.message.hidden, torch.ones(1, 1, 576)
    )


def test_a_frame_opens_only_at_its_receiver() -> None:
    sender = FrameCodec(KEYS.frame, NodeId("s"))
    other = FrameCodec(KEYS.frame, NodeId("other"))
    with pytest.raises(FrameError, match="addressed to 'receiver'"):
        other.decode(sender.encode(CloseSession(SessionId("a")), RX))
    with pytest.raises(FrameError, match="names no receiver"):
        receiver().decode(sender.encode(CloseSession(SessionId("a"))))
    gossip = FrameCodec(KEYS.frame, RX, accept_unaddressed=True)
    assert gossip.decode(sender.encode(CloseSession(SessionId("a")))).sender == "s"


@pytest.mark.parametrize(
    ("offset_s", "reason"),
    [
        (-31, "outside the window"),
        (31, "ahead of this node's clock"),
        (3, "ahead of this node's clock"),
        (-5, "before this node started"),
    ],
)
def test_frames_far_from_the_receivers_clock_are_refused(offset_s: int, reason: str) -> None:
    frame = craft(b"\x80", header_len=1, counter=offset_s * 1_000_000)
    with pytest.raises(FrameError, match=reason):
        receiver().decode(frame)


def test_frames_sealed_a_little_apart_pass_and_the_skew_is_reported() -> None:
    # 1.5 s behind: within the 2 s a sender's clock may run ahead
    rx = FrameCodec(KEYS.frame, RX, clock_ns=lambda: time.time_ns() - 1_500_000_000)
    ahead = FrameCodec(KEYS.frame, NodeId("s"))
    rx.decode(ahead.encode(CloseSession(SessionId("a")), RX))
    skew = rx.clock_skew_ms()["s"]
    assert -2_000 < skew < -1_000


def test_an_unexpected_type_is_refused_before_its_tensors_are_decoded() -> None:
    frame = FrameCodec(KEYS.frame, NodeId("s")).encode(step(torch.ones(1, 4, 8)), RX)
    with pytest.raises(FrameError, match="where a CloseSession belongs"):
        receiver().decode(frame, CloseSession)
