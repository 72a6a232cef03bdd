"""The swarm secret and what is built on it: separate keys for frames and gossip, message
counters, replay windows and the HMAC-SHA256 tag.

One 32-byte secret is shared by every node of a swarm (`swarm keygen` writes it; copy the file,
or set its 64 hex characters in the environment). HKDF-SHA256 derives one key per purpose, so a
gossip message can never be replayed as a frame. Every message carries its sender's id and a
counter; the counter is `max(last + 1, wall-clock microseconds)`, so it only grows, even across
restarts of the sender, and a receiver remembers a window of recent counters per sender to
refuse replays. A receiver that restarts forgets its windows: a frame captured before that can
be replayed once afterwards; links are short-lived enough on a LAN for this to be acceptable.

HMAC rather than an AEAD: an AEAD's nonce (sender + counter) must never repeat under one key,
and two nodes that share an id by mistake, or a clock stepped back across a restart, would then
leak the authentication key. A repeated counter under HMAC is only refused as a replay.
Activations are authenticated, not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from swarm.errors import ReplayError, SecretError, WrongKeyError

BytesLike = bytes | bytearray | memoryview

SECRET_BYTES = 32
TAG_BYTES = 32  # HMAC-SHA256, untruncated
# Used by a node started without a secret; such a node must bind to loopback only.
LOOPBACK_SECRET = b"swarm-loopback-only-not-a-secret"
_HKDF_SALT = b"swarm/wire/v1"
_MAX_SECRET_FILE_BYTES = 4096


def generate_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def generate_secret_file(path: Path, *, overwrite: bool = False) -> Path:
    """Write a new secret to `path` as 64 hex characters and a newline, readable by its owner
    only (mode 0600 from the moment it exists). Refuses to replace a file unless told to."""
    path = Path(path)
    text = (generate_secret().hex() + "\n").encode()
    target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if overwrite else path
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if target == path and path.exists():
            raise SecretError(
                f"secret file {path} already exists; refusing to replace it"
            ) from None
        raise SecretError(f"cannot write secret file {path}: a parent is not a folder") from None
    except OSError as exc:
        raise SecretError(f"cannot write secret file {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if overwrite:
            os.replace(target, path)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise SecretError(f"cannot write secret file {path}: {exc.strerror or exc}") from None
    return path


def load_secret(path: Path | None = None, env_value: str | None = None) -> bytes | None:
    """The configured 32-byte secret, or None when neither source is given (the node then
    binds to loopback only). `env_value` (64 hex characters) wins over `path`, which holds 64
    hex characters (what generate_secret_file writes) or 32 raw bytes."""
    if env_value is not None and env_value.strip():
        return _parse_hex(env_value.strip(), "the secret from the environment")
    if path is None:
        return None
    path = Path(path)
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise SecretError(f"secret file {path} is not a regular file")
            content = f.read(_MAX_SECRET_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SecretError(
            f"secret file {path} does not exist; create one with `swarm keygen`"
        ) from None
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    text = content.strip()
    if len(text) == 2 * SECRET_BYTES:
        try:
            return _parse_hex(text.decode("ascii"), f"secret file {path}")
        except UnicodeDecodeError:
            pass
    if len(content) == SECRET_BYTES:
        return content
    raise SecretError(
        f"secret file {path} must hold {SECRET_BYTES} bytes as {2 * SECRET_BYTES} hex "
        f"characters; it has {len(content)} bytes"
    )


def _parse_hex(text: str, what: str) -> bytes:
    if len(text) != 2 * SECRET_BYTES:
        raise SecretError(
            f"{what} must be {2 * SECRET_BYTES} hex characters ({SECRET_BYTES} bytes), "
            f"not {len(text)} characters"
        )
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SecretError(f"{what} is not hexadecimal") from None


@dataclass(frozen=True)
class SwarmKeys:
    """Per-purpose keys derived from the swarm secret; never printed."""

    frame: bytes = field(repr=False)  # tags node-to-node frames
    gossip: bytes = field(repr=False)  # tags gossip messages
    # names the swarm on the LAN (its first bytes, as the discovery fingerprint): public, and
    # like every key here an HKDF output that tells nothing of the secret or the other keys
    discovery: bytes = field(repr=False)
    invite: bytes = field(repr=False)  # tags invite lines (swarm.invite)

    @classmethod
    def derive(cls, secret: bytes) -> SwarmKeys:
        if len(secret) != SECRET_BYTES:
            raise SecretError(f"the swarm secret must be {SECRET_BYTES} bytes, not {len(secret)}")
        return cls(
            frame=_hkdf(secret, b"frame"),
            gossip=_hkdf(secret, b"gossip"),
            discovery=_hkdf(secret, b"discovery"),
            invite=_hkdf(secret, b"invite"),
        )

    @classmethod
    def loopback(cls) -> SwarmKeys:
        """Keys of a node without a secret: anyone can forge them, so bind to loopback only."""
        return cls.derive(LOOPBACK_SECRET)


def _hkdf(secret: bytes, purpose: bytes) -> bytes:
    kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HKDF_SALT, info=b"swarm " + purpose)
    return kdf.derive(secret)


# Per key, an HMAC whose key is already hashed in: copying it costs less than keying one per
# message, and much less where a hop's frame is handled with cold caches (a node has a few keys)
_KEYED: dict[bytes, Any] = {}
_KEYED_MAX = 64


def _keyed(key: bytes) -> Any:
    mac = _KEYED.get(key)
    if mac is None:
        if len(_KEYED) >= _KEYED_MAX:
            _KEYED.clear()
        mac = _KEYED[key] = hmac.new(key, digestmod=hashlib.sha256)
    return mac.copy()


def compute_tag(key: bytes, *parts: BytesLike) -> bytes:
    mac = _keyed(key)
    for part in parts:
        mac.update(part)
    return bytes(mac.digest())


def verify_tag(key: bytes, signed: BytesLike, tag: BytesLike) -> None:
    if not hmac.compare_digest(compute_tag(key, signed), bytes(tag)):
        raise WrongKeyError("authentication tag does not match: tampered, or a different secret")


class MessageCounter:
    """A sender's counters: strictly increasing, and at least the wall clock in microseconds,
    so a restarted sender continues above the counters it used before."""

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, self._clock_ns() // 1000)
            return self._last


@dataclass
class _Seen:
    newest: int  # the highest counter accepted
    floor: int  # counters at or below this are refused (raised when the set is full)
    counters: set[int]  # counters accepted above newest - window


class ReplayWindow:
    """Per sender, the counters accepted within `size` below its newest one. A counter is
    accepted once if it is inside that window and not seen yet. Counters are microseconds of
    the sender's clock, so the window is a span of time: messages that arrive out of order
    (gossip over separate connections, a busy event loop) pass, however many there are, up to
    `max_seen` per sender. Only `max_senders` senders are remembered, least recently heard
    dropped first."""

    def __init__(self, size: int, max_senders: int, max_seen: int = 16384) -> None:
        self._size = size
        self._max_senders = max_senders
        self._max_seen = max_seen
        self._senders: OrderedDict[str, _Seen] = OrderedDict()
        self._lock = threading.Lock()

    def accept(self, sender: str, counter: int) -> None:
        with self._lock:
            seen = self._senders.get(sender)
            if seen is None:
                seen = _Seen(counter, counter - self._size, {counter})
            else:
                if counter <= seen.floor or counter <= seen.newest - self._size:
                    raise ReplayError(f"counter {counter} from {sender!r} is too old: replay?")
                if counter in seen.counters:
                    raise ReplayError(f"counter {counter} from {sender!r} was seen: replay")
                seen.counters.add(counter)
                seen.newest = max(seen.newest, counter)
                if len(seen.counters) > self._max_seen:
                    self._forget_oldest(seen)
            self._senders[sender] = seen
            self._senders.move_to_end(sender)
            if len(self._senders) > self._max_senders:
                self._senders.popitem(last=False)

    def _forget_oldest(self, seen: _Seen) -> None:
        """Keep the newest half of a full set; everything older is refused from now on."""
        kept = sorted(c for c in seen.counters if c > seen.newest - self._size)
        keep = self._max_seen // 2
        if len(kept) > keep:
            seen.floor = kept[-keep - 1]
            kept = kept[-keep:]
        seen.counters = set(kept)
