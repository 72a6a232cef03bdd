"""The C frame path (swarm/wire/frames/) against the Python one: HMAC-SHA256 as hashlib
computes it, on the CPU's SHA instructions and in plain C; step and result frames sealed
byte for byte as `seal_frame` seals them; and what it leaves to the Python path."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import random
from collections.abc import Iterator
from typing import cast

import pytest
import torch

from swarm.errors import FrameError
from swarm.schema import HopTimes
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import (
    Codec,
    FrameCodec,
    Hop,
    Peer,
    ResultMessage,
    StepMessage,
    SwarmKeys,
    native_frames,
)
from swarm.wire.auth import compute_tag
from swarm.wire.frame import seal_frame

pytestmark = pytest.mark.skipif(
    not native_frames.available(), reason="swarm.wire._frames is not built (no C compiler)"
)

KEY = SwarmKeys.loopback().frame


@pytest.fixture(params=[True, False], ids=["sha-instructions", "plain-c"])
def sha_path(request: pytest.FixtureRequest) -> Iterator[bool]:
    frames = native_frames._frames
    assert frames is not None
    used = frames.use_sha_extensions(request.param)
    if request.param and not used:
        pytest.skip("this CPU has no SHA instructions")
    yield used
    frames.use_sha_extensions(True)


def test_hmac_is_hashlibs_for_every_length_and_key(sha_path: bool) -> None:
    frames = native_frames._frames
    assert frames is not None
    rng = random.Random(1)
    for key_len in (0, 1, 32, 63, 64, 65, 200):
        key = rng.randbytes(key_len)
        state = frames.key(key)
        for n in [*range(0, 200), 447, 448, 2677, 65_536, 1_000_003]:
            data = rng.randbytes(n)
            assert frames.tag(state, data) == hmac.new(key, data, hashlib.sha256).digest(), (
                key_len,
                n,
            )


def _hops(rng: random.Random) -> tuple[Hop, ...]:
    cuts = sorted(rng.sample(range(1, 30), rng.randint(0, 2)))
    spans = zip([0, *cuts], [*cuts, 30], strict=True)
    return tuple(
        Hop(NodeId(_name(rng)), f"10.0.0.{i}:{rng.randint(1, 65535)}", LayerSpan(a, b))
        for i, (a, b) in enumerate(spans)
    )


def _name(rng: random.Random) -> str:
    return rng.choice(["n", "node-b", "ñodo-ü", "x" * 31, "y" * 32, "z" * 255, "a" * 300])


def _number(rng: random.Random) -> float | int:
    return rng.choice([0.0, -0.0, 1.5, rng.uniform(0, 50), 1e300, float("inf"), 3, 0])


def _timings(rng: random.Random) -> tuple[HopTimes, ...]:
    return tuple(
        HopTimes(_name(rng), *(_number(rng) for _ in range(6)))  # type: ignore[arg-type]
        for _ in range(rng.randint(0, 3))
    )


def _integer(rng: random.Random) -> int:
    return rng.choice(
        [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1]
    )


def _messages(seed: int) -> Iterator[StepMessage | ResultMessage]:
    rng = random.Random(seed)
    for _ in range(400):
        rows = rng.choice([1, 1, 1, 5, 40])
        dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
        hidden = torch.randn(1, rows, rng.choice([8, 576]), dtype=dtype)
        codec = rng.choice([Codec.RAW, Codec.RAW, Codec.INT8_BLOCK64, Codec.INT8_HADAMARD64])
        session, step, position = SessionId(_name(rng)), _integer(rng), _integer(rng)
        verify, timings = rng.random() < 0.3, _timings(rng)
        if rng.random() < 0.6:
            entry = Peer(NodeId(_name(rng)), "127.0.0.1:8000")
            route = _hops(rng)
            yield StepMessage(session, step, position, hidden, route, entry, timings, codec, verify)
        else:
            yield ResultMessage(session, step, position, hidden, timings, codec, verify)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_sealed_frame_is_the_python_paths_byte_for_byte(seed: int, sha_path: bool) -> None:
    sealer = native_frames.StepSealer(KEY, "sender-ü")
    for i, message in enumerate(_messages(seed)):
        receiver = "" if i % 7 == 0 else "receiver"
        native = sealer.seal(message, 1_700_000_000_000_000 + i, receiver)
        fields, tensors = message.to_wire()
        python = seal_frame(
            KEY,
            "sender-ü",
            1_700_000_000_000_000 + i,
            message.TYPE,
            fields,
            tensors,
            compress=False,
            receiver=receiver,
        )
        # the C path covers raw float32 and float16 hidden states; the rest goes the Python way
        covered = message.codec is Codec.RAW and message.hidden.dtype != torch.bfloat16
        assert (native is not None) == covered, message
        if native is not None:
            assert native == python, message


def test_the_codec_opens_what_the_c_path_sealed_and_takes_the_python_path_where_it_must() -> None:
    rng = random.Random(7)
    route = _hops(rng)
    native = FrameCodec(KEY, NodeId("a"))
    python = FrameCodec(KEY, NodeId("a"), native=False)
    receiver = FrameCodec(KEY, route[0].node_id)
    entry = Peer(NodeId("a"), "127.0.0.1:1")
    step = StepMessage(SessionId("s"), 3, 9, torch.randn(1, 1, 64), route, entry)
    for codec in (native, python):
        opened = receiver.decode(codec.encode(step, route[0].node_id)).message
        assert opened == step
        assert isinstance(opened, StepMessage) and torch.equal(opened.hidden, step.hidden)
    # a step with no route: the Python path refuses it, as before
    with pytest.raises(Exception, match="route"):
        native.encode(StepMessage(SessionId("s"), 3, 9, torch.randn(1, 1, 64), (), entry))


def _receiver(node: str, native: bool) -> FrameCodec:
    return FrameCodec(KEY, NodeId(node), native=native, accept_unaddressed=True)


def _outcome(
    codec: FrameCodec, frame: bytes, spare: native_frames.SpareTensor | None = None
) -> tuple[str, object]:
    try:
        received = codec.decode(frame, spare=spare)
    except FrameError as e:
        return "refused", str(e)
    message = received.message
    hidden = getattr(message, "hidden", None)
    values = None if hidden is None else (hidden.dtype, hidden.shape, hidden.tolist())
    return "opened", (received.sender, received.counter, message, values)


@pytest.mark.parametrize("seed", [4, 5])
def test_an_opened_frame_is_the_python_paths_message(seed: int, sha_path: bool) -> None:
    sender = FrameCodec(KEY, NodeId("sender"), native=False)
    native, python = _receiver("receiver", True), _receiver("receiver", False)
    assert native._opener is not None
    for i, message in enumerate(_messages(seed)):
        compress = i % 9 == 0
        frame = sender.encode(message, NodeId("receiver") if i % 5 else None, compress=compress)
        # the C side opens raw float32 and float16 states in bodies that went uncompressed,
        # with timings as hops write them (finite floats >= 0); the rest goes the Python way
        raw = message.codec is Codec.RAW and message.hidden.dtype != torch.bfloat16
        covered = raw and frame[3] == 0 and all(map(_as_written, message.timings))
        covered = covered and max(message.step, message.position) <= 2**63 - 1
        assert (native._opener.open(frame) is not None) == covered, message
        mine, theirs = _outcome(native, frame), _outcome(python, frame)
        assert mine == theirs, message
        if covered:  # writable, as the Python path's copy is
            decoded = native.decode(sender.encode(message, NodeId("receiver"), compress=False))
            cast(StepMessage | ResultMessage, decoded.message).hidden.add_(0)


def _as_written(timing: HopTimes) -> bool:
    parts = dataclasses.astuple(timing)[1:]
    return all(type(p) is float and 0.0 <= p < math.inf for p in parts)


def _resigned(frame: bytes) -> bytes:
    return frame[:-32] + compute_tag(KEY, frame[:-32])


def test_a_frame_changed_anywhere_is_opened_or_refused_as_the_python_path_does() -> None:
    """Bytes changed, cut or added in the envelope and header, the tag made good again where
    the change should reach the parser: every outcome and error message is the Python path's."""
    rng = random.Random(11)
    sender = FrameCodec(KEY, NodeId("sender"), native=False)
    messages = list(_messages(6))[:60]
    native, python = _receiver("receiver", True), _receiver("receiver", False)
    opened_changed = 0
    for trial in range(6000):
        message = messages[trial % len(messages)]
        frame = bytearray(sender.encode(message, NodeId("receiver"), compress=False))
        header_end = min(len(frame) - 32, 28 + frame[6] + frame[7] + frame[16] + 256 * frame[17])
        kind = rng.random()
        if kind < 0.6:  # a byte of the envelope or the header
            at = rng.randrange(0, header_end)
            frame[at] = rng.choice([0, 1, 0x7F, 0x80, 0xC0, 0xCB, 0xD9, 0xFF, rng.randrange(256)])
        elif kind < 0.8:  # a cut
            del frame[rng.randrange(0, len(frame)) :]
        else:  # bytes added to the header
            at = rng.randrange(28, header_end)
            frame[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        changed = bytes(frame) if rng.random() < 0.2 else _resigned(bytes(frame))
        mine, theirs = _outcome(native, changed), _outcome(python, changed)
        assert mine == theirs, (trial, changed.hex())
        opened_changed += mine[0] == "opened"
    assert opened_changed > 0  # some changes still make a frame swarm reads (a digit, a name)


def test_a_spare_tensor_is_taken_by_one_opened_frame_of_its_shape_and_never_again() -> None:
    sender = FrameCodec(KEY, NodeId("sender"), native=False)
    spare = native_frames.SpareTensor()
    opener = native_frames.StepOpener(KEY, sender.limits)

    def opened(message: ResultMessage) -> torch.Tensor:
        frame = sender.encode(message, NodeId("receiver"), compress=False)
        native = opener.open(frame, spare)
        assert native is not None and native.message == message
        assert torch.equal(native.message.hidden, message.hidden)
        assert native.message.hidden.dtype == message.hidden.dtype
        return native.message.hidden

    def result(hidden: torch.Tensor) -> ResultMessage:
        return ResultMessage(SessionId("s"), 1, 2, hidden)

    first = opened(result(torch.randn(1, 1, 64)))  # no spare made yet: a tensor of its own
    assert spare.buffer() is None
    spare.refill()
    made = spare.buffer()
    assert made is not None and made.shape == (1, 1, 64)
    second = opened(result(torch.randn(1, 1, 64)))
    assert second.numpy().ctypes.data == made.ctypes.data  # the spare, filled
    assert spare.buffer() is None  # taken: the next frame gets its own until a refill
    third = opened(result(torch.randn(1, 1, 64)))
    assert third.data_ptr() not in (first.data_ptr(), second.data_ptr())
    # a spare of the same bytes in another shape or dtype is given up to that frame, viewed
    # in the frame's shape; one of other bytes is left for the next
    spare.refill()
    opened(result(torch.randn(1, 2, 32)))
    assert spare.buffer() is None
    spare.refill()
    left = spare.buffer()
    assert left is not None and left.shape == (1, 2, 32)
    opened(result(torch.randn(1, 1, 64, dtype=torch.float16)))  # 128 bytes, not 256
    assert spare.buffer() is left
    opened(result(torch.randn(1, 2, 64, dtype=torch.float16)))  # 256 bytes
    assert spare.buffer() is None
    # a frame the C side does not open leaves the spare as it was
    spare.refill()
    kept = spare.buffer()
    bfloat = sender.encode(result(torch.randn(1, 1, 64, dtype=torch.bfloat16)), NodeId("r"))
    assert opener.open(bfloat, spare) is None
    assert spare.buffer() is kept


def test_a_codec_given_a_spare_opens_what_it_opens_without_one() -> None:
    sender = FrameCodec(KEY, NodeId("sender"), native=False)
    with_spare, without = _receiver("receiver", True), _receiver("receiver", True)
    spare = native_frames.SpareTensor()
    for i, message in enumerate(_messages(6)):
        frame = sender.encode(message, NodeId("receiver"), compress=i % 9 == 0)
        assert _outcome(with_spare, frame, spare) == _outcome(without, frame)
        if i % 3:
            spare.refill()
