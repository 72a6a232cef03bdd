"""Frames between nodes: authenticated, size-capped msgpack + lz4 envelopes carrying tensors.

Use `FrameCodec` to turn messages into bytes and back; everything else here is its parts."""

from swarm.types import Hop, NodeId  # re-exported: messages name their nodes and routes with them
from swarm.wire.auth import (
    LOOPBACK_SECRET,
    SECRET_BYTES,
    SwarmKeys,
    generate_secret,
    generate_secret_file,
    load_secret,
)
from swarm.wire.codec import Codec, EncodedTensor, decode_tensor, encode_tensor
from swarm.wire.frame import VERSION as FRAME_VERSION
from swarm.wire.limits import WireLimits, activation_limits, clock_limits
from swarm.wire.messages import (
    CloseSession,
    ErrorCode,
    ErrorMessage,
    GossipFrame,
    LinkHello,
    LinkProbe,
    Message,
    MessageType,
    Peer,
    ProbeReply,
    ReloadLayers,
    ResultMessage,
    StepMessage,
)
from swarm.wire.protocol import NODE_HEADER, FrameCodec, Received, shifted_clock_ns

__all__ = [
    "FRAME_VERSION",
    "LOOPBACK_SECRET",
    "NODE_HEADER",
    "SECRET_BYTES",
    "CloseSession",
    "Codec",
    "EncodedTensor",
    "ErrorCode",
    "ErrorMessage",
    "FrameCodec",
    "GossipFrame",
    "Hop",
    "LinkHello",
    "LinkProbe",
    "Message",
    "MessageType",
    "NodeId",
    "Peer",
    "ProbeReply",
    "Received",
    "ReloadLayers",
    "ResultMessage",
    "StepMessage",
    "SwarmKeys",
    "WireLimits",
    "activation_limits",
    "clock_limits",
    "decode_tensor",
    "encode_tensor",
    "generate_secret",
    "generate_secret_file",
    "load_secret",
    "shifted_clock_ns",
]
