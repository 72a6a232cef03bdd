"""The caps every frame decoder enforces before it allocates, decompresses or unpacks."""

from __future__ import annotations

from dataclasses import dataclass, fields

from swarm.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB

FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})


@dataclass(frozen=True)
class WireLimits:
    """Defaults fit a 4096-token prefill of hidden size 4096 in float32 (64 MiB). Decoding one
    frame holds at most the frame, twice max_body_bytes while lz4 hands over its output, and
    the decoded tensors."""

    max_frame_bytes: int = 72 * MIB  # bytes of one frame as received: envelope, body, tag
    max_body_bytes: int = 72 * MIB  # bytes of a frame's body after lz4 decompression
    max_header_bytes: int = 64 * KIB  # bytes of the msgpack header inside the body
    max_str_len: int = 4 * KIB  # bytes of one msgpack string
    max_bin_len: int = 4 * KIB  # bytes of one msgpack binary
    max_array_len: int = 1024  # items of one msgpack array (route hops, timings, shapes)
    max_map_len: int = 64  # entries of one msgpack map
    max_tensors: int = 8  # tensors in one frame
    max_tensor_elements: int = 16 * MIB  # elements of one tensor
    max_rank: int = 4  # dimensions of one tensor
    allowed_dtypes: frozenset[str] = FLOAT_DTYPES  # dtype names a tensor may decode to
    # counters (microseconds of the sender's clock) behind a sender's newest that are still
    # accepted once: 30 s, so messages that overtake each other on separate connections pass
    replay_window: int = 30_000_000
    max_senders: int = 4096  # senders whose replay windows are kept, least recent dropped
    # microseconds a frame's counter may differ from the receiver's clock, either way: the
    # time a captured frame stays replayable at all, and the clock skew nodes may have
    clock_window_us: int = 30_000_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and value <= 0:
                raise ConfigError(f"wire.{f.name} must be > 0, not {value}")
        unknown = self.allowed_dtypes - FLOAT_DTYPES
        if unknown:
            raise ConfigError(
                f"wire.allowed_dtypes has unsupported {sorted(unknown)}; "
                f"choose from {sorted(FLOAT_DTYPES)}"
            )
