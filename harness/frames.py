"""Frames as a key holder with a bug (or worse) could write them, for the wire tests: any
envelope field, correctly tagged."""

from __future__ import annotations

import time

from swarm.wire import SwarmKeys, generate_secret
from swarm.wire.auth import compute_tag
from swarm.wire.frame import MAGIC, PRELUDE, VERSION

KEYS = SwarmKeys.derive(generate_secret())  # the wire tests' swarm


def craft(
    body: bytes,
    *,
    header_len: int,
    raw_len: int | None = None,
    flags: int = 0,
    version: int = VERSION,
    message_type: int = 3,
    sender: bytes = b"mallory",
    receiver: bytes = b"receiver",
    counter: int = 0,
    key: bytes = KEYS.frame,
) -> bytes:
    """A frame with any envelope fields, correctly tagged: what a key holder with a bug (or
    worse) could send. `counter` counts microseconds from now."""
    prelude = PRELUDE.pack(
        MAGIC,
        version,
        flags,
        message_type,
        len(sender),
        len(receiver),
        now_us() + counter,
        header_len,
        len(body),
        len(body) if raw_len is None else raw_len,
    )
    return prelude + sender + receiver + body + compute_tag(key, prelude, sender, receiver, body)


def now_us() -> int:
    return time.time_ns() // 1000
