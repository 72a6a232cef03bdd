"""The frame envelope: bytes <-> (message type, sender, receiver, counter, header map, tensors).

    offset  bytes  field (little-endian)
    0       2      magic b"SW"
    2       1      protocol version
    3       1      flags: bit 0 = body is lz4 block-compressed (where that saves 1/16 of it);
                   other bits must be 0
    4       2      message type (MessageType)
    6       1      sender id length s (1..255, UTF-8)
    7       1      receiver id length d (0..255, UTF-8; 0 = not addressed to one node)
    8       8      counter: microseconds of the sender's clock (replay protection)
    16      4      header length h: the msgpack header at the start of the raw body
    20      4      stored body length b
    24      4      raw body length r (after decompression; equals b when not compressed)
    28      s      sender id
    28+s    d      receiver id
    28+s+d  b      body: msgpack header {"m": message fields, "t": tensor specs}, then payloads
    ...     32     HMAC-SHA256 over every byte before it

The tag covers the receiver and the counter, so a frame cannot be replayed to another node
(it names its receiver) or later (the receiver refuses counters far behind its own clock or
more than a little ahead of it, and counters its previous run may have taken). Decoding
checks, in order: the frame size, the fixed fields and the declared lengths against the
limits, the tag, the receiver, the clock and the replay window, then decompresses into at
most r bytes, and unpacks the header with msgpack's own length caps. Anything wrong is a
FrameError.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lz4.block
import msgpack

from swarm.errors import (
    ClockWindowError,
    FrameError,
    MisaddressedError,
    ReplayError,
    VersionError,
)
from swarm.wire.auth import TAG_BYTES, BytesLike, ReplayWindow, compute_tag, verify_tag
from swarm.wire.codec import Codec, EncodedTensor, check_spec
from swarm.wire.fields import Fields
from swarm.wire.limits import WireLimits
from swarm.wire.lz4_odds import pays

MAGIC = b"SW"
VERSION = 2  # 2 added the receiver
SUPPORTED_VERSIONS = frozenset({2})
FLAG_LZ4 = 0x01
KNOWN_FLAGS = FLAG_LZ4
PRELUDE = struct.Struct("<2sBBHBBQIII")
_U32_MAX = 2**32 - 1
_MIN_COMPRESS = 64  # bytes: below this lz4 cannot win
_CODECS: dict[int, Codec] = {int(c): c for c in Codec}


@dataclass(frozen=True)
class OpenedFrame:
    """A frame whose tag, counter and limits passed; tensors are still encoded."""

    type: int
    sender: str
    receiver: str  # "" when the frame names no receiver
    counter: int
    fields: Fields
    tensors: tuple[EncodedTensor, ...]


def seal_frame(
    key: bytes,
    sender: str,
    counter: int,
    message_type: int,
    fields: dict[str, Any],
    tensors: Sequence[EncodedTensor] = (),
    *,
    compress: bool = True,
    receiver: str = "",
) -> bytes:
    specs = [
        {"dtype": t.dtype, "shape": list(t.shape), "codec": int(t.codec), "nbytes": len(t.data)}
        for t in tensors
    ]
    try:
        header = msgpack.packb({"m": fields, "t": specs}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"cannot pack the header: {exc}") from None
    payloads = [t.data for t in tensors]
    return seal_envelope(
        key, sender, counter, message_type, header, payloads, compress=compress, receiver=receiver
    )


def seal_envelope(
    key: bytes,
    sender: str,
    counter: int,
    message_type: int,
    header: bytes,
    payloads: Sequence[BytesLike] = (),
    *,
    compress: bool = True,
    receiver: str = "",
) -> bytes:
    """Frame already-packed header bytes and payloads (tests craft hostile headers with this)."""
    sender_bytes, receiver_bytes = sender.encode(), receiver.encode()
    if not 1 <= len(sender_bytes) <= 255:
        raise FrameError(f"sender id must be 1..255 bytes of UTF-8, not {len(sender_bytes)}")
    if len(receiver_bytes) > 255:
        raise FrameError(f"receiver id must be 0..255 bytes of UTF-8, not {len(receiver_bytes)}")
    body: bytes = b"".join([header, *payloads])
    raw_len = len(body)
    if raw_len > _U32_MAX:
        raise FrameError(f"frame body of {raw_len} bytes does not fit a frame")
    flags = 0
    if compress and raw_len >= _MIN_COMPRESS:
        packed = lz4.block.compress(body, store_size=False)
        if pays(raw_len, len(packed)):
            body, flags = packed, FLAG_LZ4
    try:
        prelude = PRELUDE.pack(
            MAGIC,
            VERSION,
            flags,
            message_type,
            len(sender_bytes),
            len(receiver_bytes),
            counter,
            len(header),
            len(body),
            raw_len,
        )
    except struct.error as exc:  # a message type or counter out of its field's range
        raise FrameError(f"cannot pack the envelope: {exc}") from None
    signed = b"".join([prelude, sender_bytes, receiver_bytes, body])
    return signed + compute_tag(key, signed)


def is_compressed(frame: BytesLike) -> bool:
    """Whether a sealed frame's body went compressed."""
    return bool(memoryview(frame)[3] & FLAG_LZ4)


@dataclass(frozen=True)
class Recipient:
    """Who opens frames, and when: what binds a frame to its receiver and to time."""

    node_id: str  # frames addressed to another node are refused
    accept_unaddressed: bool  # whether frames that name no receiver pass (gossip's joins)
    now_us: int  # the receiver's clock, microseconds
    # counters below this were sealed before the receiver started, or may have been taken by
    # its previous run
    started_us: int


def open_frame(
    data: BytesLike,
    key: bytes,
    limits: WireLimits,
    replay: ReplayWindow | None,
    recipient: Recipient | None = None,
) -> OpenedFrame:
    try:
        view = memoryview(data).cast("B")
    except (TypeError, ValueError):
        raise FrameError(f"a frame must be bytes, not {type(data).__name__}") from None
    size = view.nbytes
    if size > limits.max_frame_bytes:
        raise FrameError(f"frame of {size} bytes is over the limit of {limits.max_frame_bytes}")
    if size < PRELUDE.size + TAG_BYTES:
        raise FrameError(f"frame of {size} bytes is too short")
    (
        magic,
        version,
        flags,
        mtype,
        sender_len,
        receiver_len,
        counter,
        header_len,
        body_len,
        raw_len,
    ) = PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise FrameError("not a swarm frame (bad magic)")
    if version not in SUPPORTED_VERSIONS:
        raise VersionError(
            f"protocol version {version} is not supported (this node speaks {VERSION})"
        )
    if flags & ~KNOWN_FLAGS:
        raise FrameError(f"unknown flags {flags:#x}")
    ids_end = PRELUDE.size + sender_len + receiver_len
    if sender_len == 0 or ids_end + body_len + TAG_BYTES != size:
        raise FrameError("declared lengths do not add up to the frame's size")
    compressed = bool(flags & FLAG_LZ4)
    _check_lengths(limits, header_len, body_len, raw_len, compressed)
    verify_tag(key, view[: size - TAG_BYTES], view[size - TAG_BYTES :])
    sender = _text(view[PRELUDE.size : PRELUDE.size + sender_len], "sender")
    receiver = _text(view[PRELUDE.size + sender_len : ids_end], "receiver")
    if recipient is not None:
        check_recipient(recipient, limits, receiver, counter)
    if replay is not None:
        replay.accept(sender, counter)
    body = view[ids_end : ids_end + body_len]
    if compressed:
        body = memoryview(_decompress(body, raw_len))
    header = Fields(unpack_limited(body[:header_len], limits), "header")
    tensors = _tensors(header.get_list("t", []), body[header_len:], limits)
    return OpenedFrame(mtype, sender, receiver, counter, header.get_fields("m"), tensors)


def _text(raw: memoryview, what: str) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise FrameError(f"{what} id is not UTF-8") from None


def check_recipient(recipient: Recipient, limits: WireLimits, receiver: str, counter: int) -> None:
    """FrameError unless the frame is for this recipient (its receiver, or none where that
    passes) and was sealed within its clock window."""
    if receiver != recipient.node_id and (receiver or not recipient.accept_unaddressed):
        raise MisaddressedError(
            f"frame addressed to {receiver!r}, not to this node: replayed from another link, "
            "or two nodes advertise one address?"
            if receiver
            else "frame names no receiver",
            receiver,
        )
    check_clock(recipient, limits, counter)


def check_clock(recipient: Recipient, limits: WireLimits, counter: int) -> None:
    """FrameError unless `counter` (microseconds of the sender's clock) is at most the clock
    window behind the recipient's clock and at most `limits.clock_ahead_us` ahead of it, and
    not below `recipient.started_us`."""
    apart_us = counter - recipient.now_us
    if -apart_us > limits.clock_window_us:
        raise ClockWindowError(
            f"frame sealed {apart_us / 1e6:+.1f} s from this node's clock, outside the window "
            f"of {limits.clock_window_us / 1e6:g} s: a replay, or clocks apart (run NTP)"
        )
    if apart_us > limits.clock_ahead_us:
        raise ClockWindowError(
            f"frame sealed {apart_us / 1e6:+.1f} s ahead of this node's clock, more than the "
            f"{limits.clock_ahead_us / 1e6:g} s allowed (net.max_clock_ahead_s): clocks apart "
            "(run NTP), or a frame kept to replay after this node restarts"
        )
    if counter < recipient.started_us:
        raise ReplayError(
            "frame sealed before this node started, or so little after that its previous "
            "run may have taken it: a replay?"
        )


def _check_lengths(
    limits: WireLimits, header_len: int, body_len: int, raw_len: int, compressed: bool
) -> None:
    if raw_len > limits.max_body_bytes:
        raise FrameError(
            f"body of {raw_len} bytes is over the limit of {limits.max_body_bytes} bytes"
        )
    if header_len > limits.max_header_bytes:
        raise FrameError(
            f"header of {header_len} bytes is over the limit of {limits.max_header_bytes}"
        )
    if header_len == 0 or header_len > raw_len:
        raise FrameError(f"header length {header_len} does not fit a body of {raw_len} bytes")
    if not compressed and body_len != raw_len:
        raise FrameError("an uncompressed body must be as long as its raw length")


def _decompress(body: memoryview, raw_len: int) -> bytes:
    # uncompressed_size caps the output buffer: a bomb fails at raw_len bytes, no later.
    try:
        raw: bytes = lz4.block.decompress(body, uncompressed_size=raw_len)
    except Exception as exc:  # LZ4BlockError, or ValueError on odd sizes
        raise FrameError(f"lz4 body does not decompress: {exc}") from None
    if len(raw) != raw_len:
        raise FrameError(f"lz4 body decompressed to {len(raw)} bytes, declared {raw_len}")
    return raw


def unpack_limited(header: BytesLike, limits: WireLimits) -> Any:
    """msgpack bytes -> values, within the limits' caps; FrameError when they do not fit."""
    try:
        return msgpack.unpackb(
            header,
            raw=False,
            strict_map_key=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises ValueError subclasses, UnpackException, ...
        raise FrameError(f"malformed msgpack header: {type(exc).__name__}: {exc}") from None


def _tensors(
    specs: list[Any], payload: memoryview, limits: WireLimits
) -> tuple[EncodedTensor, ...]:
    """Tensor specs {dtype, shape, codec, nbytes} -> payload slices, checked against limits.
    Read directly rather than through Fields: this runs for every frame."""
    if len(specs) > limits.max_tensors:
        raise FrameError(f"{len(specs)} tensors is over the limit of {limits.max_tensors}")
    out: list[EncodedTensor] = []
    offset = 0
    for spec in specs:
        if type(spec) is not dict:
            raise FrameError("a tensor spec must be a map")
        dtype, dims = spec.get("dtype"), spec.get("shape")
        value, declared = spec.get("codec"), spec.get("nbytes")
        if type(dtype) is not str or type(dims) is not list or type(declared) is not int:
            raise FrameError("a tensor spec needs dtype, shape, codec and nbytes")
        codec = _CODECS.get(value) if type(value) is int else None
        if codec is None:
            raise FrameError(f"unknown tensor codec {value!r}")
        if not all(type(d) is int and d >= 0 for d in dims):
            raise FrameError(f"tensor dimensions must be integers >= 0, not {dims!r}")
        shape = tuple(dims)
        nbytes = check_spec(dtype, shape, codec, limits)
        if declared != nbytes:
            raise FrameError(f"tensor payload is {declared} bytes, needs {nbytes}")
        if offset + nbytes > len(payload):
            raise FrameError("tensor payloads run past the end of the body")
        out.append(EncodedTensor(dtype, shape, codec, payload[offset : offset + nbytes]))
        offset += nbytes
    if offset != len(payload):
        raise FrameError(f"{len(payload) - offset} bytes after the last tensor")
    return tuple(out)
