"""The caps every frame decoder enforces before it allocates, decompresses or unpacks."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from swarm.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB

FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})
_WIDEST_VALUE_BYTES = 4  # float32: the widest dtype a peer may send activations in
# bytes of a frame besides its header and payloads: the prelude (28), two ids of up to 255
# bytes and the tag (32), rounded up
_ENVELOPE_BYTES = 1 * KIB
# What a frame may grow by over the exact bound, so a message that gains a small field in a
# later version does not trip the check
_MARGIN_BYTES = 64 * KIB


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
    # microseconds a frame's counter may lag the receiver's clock: the time a captured frame
    # stays replayable at all, and how far behind a node's clock may run
    clock_window_us: int = 30_000_000
    # microseconds a frame's counter may run ahead of the receiver's clock (net.
    # max_clock_ahead_s): what a receiver that restarts refuses past its start, since its
    # previous run may have taken frames sealed up to that far ahead
    clock_ahead_us: int = 2_000_000

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


def clock_limits(max_clock_ahead_s: float, base: WireLimits | None = None) -> WireLimits:
    """`base` (the defaults) with frames sealed more than `max_clock_ahead_s` ahead refused."""
    return replace(base or WireLimits(), clock_ahead_us=max(1, round(max_clock_ahead_s * 1e6)))


def activation_limits(hidden_size: int, chunk_tokens: int, base: WireLimits) -> WireLimits:
    """`base` with frames capped at the largest one a link of this model carries, and a small
    margin: a step of one prefill chunk, hidden [1, chunk_tokens, hidden_size] (a long
    prefill and a failover's replay travel chunk by chunk; decode steps, batched or not, one
    token per session and frame), in float32, the widest dtype a peer may serve in, plus the
    route and timings in its header (at most base.max_header_bytes).

    A peer that cuts longer prefill chunks than this node (runtime.prefill_chunk_tokens) has
    its frames refused and its link closed: a swarm's nodes share that setting."""
    if hidden_size <= 0 or chunk_tokens <= 0:
        raise ConfigError(
            f"a link's frames need a hidden size and chunk length > 0, not "
            f"{hidden_size} and {chunk_tokens}"
        )
    values = hidden_size * chunk_tokens
    frame = values * _WIDEST_VALUE_BYTES + base.max_header_bytes + _ENVELOPE_BYTES + _MARGIN_BYTES
    return replace(base, max_frame_bytes=frame, max_body_bytes=frame, max_tensor_elements=values)
