"""The one exception tree of swarm. Everything from outside (a request, a file, a config, a
frame) that is wrong raises one of these, never an assert, and each becomes an HTTP response or
an error frame in exactly one place.

    SwarmError
    ├── ConfigError              a config file, flag or environment value is invalid
    │   ├── SecretError              the swarm secret is missing, unreadable or not 32 bytes
    │   ├── BindError                a port this node listens on is taken or cannot be bound
    │   └── InviteError              an invite line that is malformed, edited or expired
    ├── SpanError                a layer span is malformed or outside the model
    ├── ActivationError          hidden states of the wrong shape or dtype for a shard
    ├── ModelError               anything about finding, converting or loading a checkpoint
    │   ├── ModelNotFoundError       unknown model name, missing file or folder
    │   ├── CorruptModelError        a checkpoint or cache file that cannot be read as promised
    │   ├── UnsupportedModelError    a model family, or a feature of one, no adapter implements
    │   ├── CacheWriteError          the per-layer cache folder cannot be written
    │   └── TransferError            parts could not be fetched from any peer holding them
    ├── KVCacheError             per-session attention caches
    │   ├── KVCacheFullError         the byte budget cannot fit a session even after eviction
    │   ├── SessionNotFoundError     a step for a session this shard does not hold
    │   └── PositionMismatchError    a step's position does not continue the session's cache
    ├── SamplingError            invalid sampling parameters (temperature < 0, top_p > 1, ...)
    ├── NoChatTemplateError      a chat request to a model without a chat template (a base model)
    ├── ComputeError             the compute thread is closed or its queue is full
    ├── NoRouteError             no chain of usable peers covers every layer (names the missing)
    ├── NodeLeavingError         this node is shutting down and takes no new requests
    ├── LinkError                a peer could not be reached, or its link closed mid-send
    ├── RefusedError             a node answered a client's request with an error status
    ├── HopFailedError           a hop of a route failed a step (error frame or deadline)
    ├── StatusFormatError        a node's status or request trace JSON that does not fit its schema
    └── FrameError               a frame or gossip message that is malformed, over a limit,
        │                        unauthenticated or replayed; the link that sent it is closed
        ├── WrongKeyError            its tag does not open under this swarm's key
        ├── ClockWindowError         sealed outside the clock window of the receiver's clock
        ├── VersionError             another protocol version
        ├── ReplayError              a counter seen before, or older than the replay window
        └── MisaddressedError        an authentic frame that names another receiver, or none
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from swarm.types import LayerSpan, NodeId


class SwarmError(Exception):
    """Base class of every error swarm raises on purpose."""


class ConfigError(SwarmError):
    pass


class SpanError(SwarmError):
    pass


class ActivationError(SwarmError):
    pass


class ModelError(SwarmError):
    pass


class ModelNotFoundError(ModelError):
    pass


class CorruptModelError(ModelError):
    pass


class CacheWriteError(ModelError):
    pass


class UnsupportedModelError(ModelError):
    pass


class TransferError(ModelError):
    pass


class KVCacheError(SwarmError):
    pass


class KVCacheFullError(KVCacheError):
    pass


class SessionNotFoundError(KVCacheError):
    pass


class PositionMismatchError(KVCacheError):
    pass


class PrefixMissingError(KVCacheError):
    """A step asked a hop to start its session from kept prompt blocks it no longer holds
    (evicted for room, or the node restarted): the entry starts from the blocks it does
    hold (`held`, from the first) instead, or sends the prompt whole."""

    def __init__(self, message: str, held: int, node_id: NodeId | None = None) -> None:
        super().__init__(message)
        self.held = held
        self.node_id = node_id  # the hop, where the entry knows it


class SamplingError(SwarmError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the request field at fault, where one is


class NoChatTemplateError(SwarmError):
    code = "no_chat_template"  # the API's error code for it, so clients can tell it apart


class ComputeError(SwarmError):
    pass


class NoRouteError(SwarmError):
    def __init__(self, message: str, missing: tuple[LayerSpan, ...], moving: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        # the live members' memory holds every layer: the gap is a re-plan in progress, and
        # the layers will be served again once the nodes loading them announce them
        self.moving = moving


class NodeLeavingError(SwarmError):
    pass


class LinkError(SwarmError):
    pass


class RefusedError(SwarmError):
    """What a node answered a client (`swarm.client`) instead of an answer: the HTTP
    `status`, and the seconds its Retry-After header asks to wait (None without one)."""

    def __init__(self, message: str, status: int, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class HopFailedError(SwarmError):
    """`node_id` names the failed hop when it is known."""

    def __init__(self, message: str, node_id: NodeId | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id


class SecretError(ConfigError):
    pass


class BindError(ConfigError):
    pass


class InviteError(ConfigError):
    pass


# what a node counts a refused frame as, in /status (`refusals`, `refused_from`)
FrameRefusal = Literal["bad_frame", "wrong_key", "clock", "version", "replay", "misaddressed"]


class FrameError(SwarmError):
    """Why a frame was refused is `reason`; the message is the same text. `refusal` is the
    kind a node counts it as: the subclasses name the causes an admin can fix."""

    refusal: ClassVar[FrameRefusal] = "bad_frame"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def counted_as(self, generic: str) -> str:
        """The refusal to count: the cause where it is known, else `generic`."""
        return generic if self.refusal == "bad_frame" else self.refusal


class WrongKeyError(FrameError):
    refusal = "wrong_key"


class ClockWindowError(FrameError):
    refusal = "clock"


class VersionError(FrameError):
    refusal = "version"


class ReplayError(FrameError):
    refusal = "replay"


class MisaddressedError(FrameError):
    """An authentic frame sealed for another node (two nodes at one address?), or for none:
    its sender may learn this node's id (a gossip join's first frame) and seal it again.
    `receiver`: the node the frame names, "" for none."""

    refusal = "misaddressed"

    def __init__(self, reason: str, receiver: str) -> None:
        super().__init__(reason)
        self.receiver = receiver


class StatusFormatError(SwarmError):
    pass
