"""How a link proves the swarm key before it exists: its opener asks the receiver's node id
(a plain GET of the link path; the id is no secret), then sends the websocket upgrade request
with a LinkHello frame addressed to that id in a header. The receiver checks the hello before
it makes the websocket: one that authenticates gets a socket with the message limit a link
needs and READY as its first message; one that does not gets a socket with a limit of a few
KiB, closed at once with the reason.

Why in the upgrade request rather than as the websocket's first message: aiohttp fixes a
websocket's message size limit once, when the socket is made, and an authenticated link must
take activation frames of megabytes. A hello in a header is read under the HTTP parser's own
field limit and the connection's header deadline, so a stranger costs a few KiB, and the
link's limit can be the one authenticated peers need."""

from __future__ import annotations

import base64
import binascii

from swarm.errors import FrameError
from swarm.types import NodeId
from swarm.wire import FrameCodec, LinkHello, Received

HELLO_HEADER = "X-Swarm-Hello"
# characters of the header's value: base64 of a hello frame, whose ids take at most 510 bytes
MAX_HELLO_CHARS = 1024
MAX_NODE_ID_BYTES = 255  # a node id on the wire is 1..255 bytes of UTF-8
READY = "ready"  # a link's first message from its receiver: the hello authenticated


def hello_header(codec: FrameCodec, receiver: NodeId) -> str:
    """The header value that opens a link to `receiver`."""
    return base64.b64encode(codec.encode(LinkHello(), receiver, compress=False)).decode("ascii")


def open_hello(codec: FrameCodec, value: str | None) -> Received:
    """The authenticated hello in a link's upgrade request; FrameError when there is none, or
    it is too long, not base64, or does not open (another key, receiver or time, a replay)."""
    if value is None:
        raise FrameError(f"a link opens with a hello frame in its {HELLO_HEADER} header")
    if len(value) > MAX_HELLO_CHARS:
        raise FrameError(f"a hello of {len(value)} characters is over {MAX_HELLO_CHARS}")
    try:
        frame = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise FrameError(f"the {HELLO_HEADER} header is not base64") from None
    return codec.decode(frame, expect=LinkHello)
