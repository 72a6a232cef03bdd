"""Property tests: whatever bytes arrive, decoding returns a message or raises FrameError, and
nothing else. Authenticated garbage is tested too, since a tag only proves who sent it."""

from __future__ import annotations

from typing import Any

import lz4.block
import msgpack
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.frames import KEYS, craft, now_us
from swarm.errors import FrameError
from swarm.schema import HopTimes
from swarm.types import LayerSpan, SessionId
from swarm.wire import (
    CloseSession,
    Codec,
    ErrorCode,
    ErrorMessage,
    FrameCodec,
    Hop,
    NodeId,
    Peer,
    Received,
    StepMessage,
)
from swarm.wire.codec import encode_tensor
from swarm.wire.frame import FLAG_LZ4, seal_frame

# CI machines are slow and shared: no per-example deadline, a bounded number of examples.
FUZZ = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
# examples of nested values in up to 8 fields are big to draw (~60 ms each here): fewer of them
FUZZ_FIELDS = settings(FUZZ, max_examples=120)


def _decode_or_frame_error(data: Any) -> Received | None:
    try:
        return FrameCodec(KEYS.frame, NodeId("receiver")).decode(data)
    except FrameError:
        return None


def _valid_frames() -> list[bytes]:
    sender = FrameCodec(KEYS.frame, NodeId("s"))
    route = (
        Hop(NodeId("a"), "10.0.0.1:1", LayerSpan(0, 3)),
        Hop(NodeId("b"), "10.0.0.2:1", LayerSpan(3, 9)),
    )
    entry = Peer(NodeId("e"), "10.0.0.3:1")
    timing = (HopTimes(NodeId("a"), 0.1, 2.0, 0.01),)
    out = [
        sender.encode(CloseSession(SessionId("s")), NodeId("receiver")),
        sender.encode(
            ErrorMessage(SessionId("s"), 3, ErrorCode.WRONG_SPAN, "gone", NodeId("b")),
            NodeId("receiver"),
        ),
    ]
    for codec in Codec:
        for hidden in (torch.randn(1, 3, 70), torch.zeros(1, 5, 64).bfloat16()):
            message = StepMessage(SessionId("s"), 1, 2, hidden, route, entry, timing, codec)
            out.append(sender.encode(message, NodeId("receiver")))
    assert any(f[3] & FLAG_LZ4 for f in out) and any(not f[3] & FLAG_LZ4 for f in out)
    return out


VALID = _valid_frames()


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(data: bytes) -> None:
    assert _decode_or_frame_error(data) is None


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_truncated_frames(frame: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(frame) - 1))
    assert _decode_or_frame_error(frame[:cut]) is None


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_bit_flipped_frames(frame: bytes, data: st.DataObject) -> None:
    bad = bytearray(frame)
    for bit in data.draw(st.sets(st.integers(0, 8 * len(frame) - 1), min_size=1, max_size=8)):
        bad[bit // 8] ^= 1 << (bit % 8)
    assert _decode_or_frame_error(bytes(bad)) is None


@FUZZ
@given(
    body=st.binary(max_size=2048),
    header_len=st.integers(0, 2**32 - 1) | st.integers(0, 2048),
    raw_len=st.none() | st.integers(0, 2**32 - 1) | st.integers(0, 4096),
    flags=st.sampled_from([0, FLAG_LZ4]) | st.integers(0, 255),
    message_type=st.integers(0, 2**16 - 1) | st.integers(1, 5),
)
def test_authenticated_random_envelopes(
    body: bytes, header_len: int, raw_len: int | None, flags: int, message_type: int
) -> None:
    frame = craft(
        body, header_len=header_len, raw_len=raw_len, flags=flags, message_type=message_type
    )
    _decode_or_frame_error(frame)  # may decode; must not raise anything else


MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(["session", "route", "t"]), inner)
    ),
    max_leaves=40,
)
FIELD_NAMES = st.sampled_from(
    ["session", "step", "pos", "route", "entry", "timings", "code", "reason", "hop", "model"]
)


@FUZZ_FIELDS
@given(
    fields=st.dictionaries(FIELD_NAMES | st.text(max_size=5), MSGPACK_VALUES, max_size=8),
    message_type=st.integers(1, 6),
    codecs=st.lists(st.sampled_from(list(Codec)), max_size=2),
)
def test_authenticated_random_fields(
    fields: dict[str, Any], message_type: int, codecs: list[Codec]
) -> None:
    tensors = [encode_tensor(torch.randn(1, 2, 8), codec) for codec in codecs]
    frame = seal_frame(
        KEYS.frame, "s", now_us(), message_type, fields, tensors, receiver="receiver"
    )
    _decode_or_frame_error(frame)


@FUZZ
@given(header=MSGPACK_VALUES, payload=st.binary(max_size=512), compress=st.booleans())
def test_authenticated_random_headers(header: Any, payload: bytes, compress: bool) -> None:
    packed = msgpack.packb(header)
    body = packed + payload
    if compress:
        stored = lz4.block.compress(body, store_size=False)
        frame = craft(stored, header_len=len(packed), raw_len=len(body), flags=FLAG_LZ4)
    else:
        frame = craft(body, header_len=len(packed))
    _decode_or_frame_error(frame)
