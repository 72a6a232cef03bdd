"""One line that brings a machine into a swarm: `swarm invite` prints it on a member, and
`swarm node --invite LINE` (or SWARM_INVITE) joins with it.

The line is `swarm://` and the base64url (unpadded) bytes of a msgpack map and a tag:

    {"v": 1, "secret": the swarm secret (32 bytes), "token": the API token (absent without
     one), "join": ["host:port", ...] (the member's advertised address first), "expires":
     unix seconds (absent: the line never expires)}

and then 16 bytes of HMAC-SHA256 over the map's bytes under `SwarmKeys.invite`, which HKDF
derives from the secret in the line. A line that was edited (its expiry pushed back, an
address or the token changed, a character lost in a paste) fails the tag and is refused, and
so is one used after its expiry. The tag is no barrier to someone who means it: whoever holds
the line holds the swarm secret, so can write a new tag, and once joined is a member for good.
The expiry bounds how long the line itself works as it was handed out (pasted in a chat, left
in a shell history); keep it as secret as the key file it carries.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from swarm.config import Config
from swarm.errors import ConfigError, InviteError
from swarm.private_files import write_private
from swarm.types import split_host_port
from swarm.wire import SECRET_BYTES, SwarmKeys

PREFIX = "swarm://"
VERSION = 1
_TAG_BYTES = 16  # 128 bits of HMAC-SHA256: an edit goes unnoticed with odds of 2^-128
_MAX_LINE = 4096  # characters; a line is a few hundred
MAX_ADDRESSES = 4  # member addresses a line carries: the member's own, then others alive
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Invite:
    secret: bytes = field(repr=False)
    token: str | None = field(repr=False)  # the API token, None where the swarm has none
    join: tuple[str, ...]  # host:port of members, joined as --join addresses are
    expires_at: int | None = None  # unix seconds; None = never


def encode_invite(invite: Invite) -> str:
    body: dict[str, Any] = {"v": VERSION, "secret": invite.secret, "join": list(invite.join)}
    if invite.token is not None:
        body["token"] = invite.token
    if invite.expires_at is not None:
        body["expires"] = invite.expires_at
    packed = msgpack.packb(body, use_bin_type=True)
    raw = packed + _tag(invite.secret, packed)
    return PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_invite(line: str, now: float) -> Invite:
    """The invite in `line`, checked at `now` (unix seconds); InviteError, one line, for a
    malformed, edited or expired one."""
    text = line.strip()
    if not text.startswith(PREFIX) or len(text) > _MAX_LINE:
        raise InviteError(f"an invite line starts with {PREFIX} (swarm invite prints one)")
    encoded = text[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise InviteError("the invite line is cut or mistyped: it is not base64url") from None
    packed, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
    invite = _read(packed)
    if not hmac.compare_digest(tag, _tag(invite.secret, packed)):
        raise InviteError("the invite line was changed after it was made: ask for a new one")
    if invite.expires_at is not None and now >= invite.expires_at:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(invite.expires_at))
        raise InviteError(f"the invite line expired at {when}: ask for a new one")
    return invite


def _read(packed: bytes) -> Invite:
    try:
        body = msgpack.unpackb(packed, raw=False, strict_map_key=True, max_bin_len=1024)
    except (ValueError, msgpack.UnpackException):
        body = None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise InviteError("the invite line is cut or mistyped, or from another swarm version")
    secret, token = body.get("secret"), body.get("token")
    join, expires = body.get("join"), body.get("expires")
    if not (
        isinstance(secret, bytes)
        and len(secret) == SECRET_BYTES
        and (token is None or (isinstance(token, str) and token != ""))
        and isinstance(join, list)
        and 0 < len(join) <= MAX_ADDRESSES
        and all(isinstance(a, str) for a in join)
        and (expires is None or (isinstance(expires, int) and not isinstance(expires, bool)))
    ):
        raise InviteError("the invite line is cut or mistyped: a field is missing or wrong")
    for address in join:
        try:
            split_host_port(address)
        except ConfigError:
            raise InviteError(f"the invite line's address {address!r} is not host:port") from None
    return Invite(secret, token, tuple(join), expires)


def _tag(secret: bytes, packed: bytes) -> bytes:
    key = SwarmKeys.derive(secret).invite
    return hmac.digest(key, packed, "sha256")[:_TAG_BYTES]


def parse_duration(text: str) -> int:
    """Seconds in '90s', '30m', '1h', '7d'; ConfigError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text)
    if match is None or int(match.group(1)) == 0:
        raise ConfigError(f"--expires {text!r}: give a duration such as 30m, 1h or 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def join_addresses(own: str, members: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The addresses a line carries: the member's own, then those of other live members (by
    (address, state)), MAX_ADDRESSES at most."""
    found = [own]
    for address, state in members:
        if state == "alive" and address not in found:
            found.append(address)
    return tuple(found[:MAX_ADDRESSES])


@dataclass(frozen=True)
class KeptFiles:
    secret_file: Path
    token_file: Path | None


def kept_by_an_invite(where: Config) -> KeptFiles | None:
    """The files an earlier invite kept in the state folder, for a node whose config names
    no secret file: a node invited once starts again with no line and no flags. None where
    the config names a secret file or no invite kept one."""
    if where.node.secret_file is not None:
        return None
    state = where.node.state_dir.expanduser()
    secret_file, token_file = state / "swarm.key", state / "api.token"
    if not secret_file.is_file():
        return None
    if where.api.token_file is not None or not token_file.is_file():
        return KeptFiles(secret_file, None)
    return KeptFiles(secret_file, token_file)


def keep_invite(invite: Invite, where: Config) -> KeptFiles:
    """Write the invite's secret and token where the node reads them: the files its config
    names, else swarm.key and api.token in its state folder (mode 0600). A file that holds
    something else already is refused, never replaced."""
    state = where.node.state_dir.expanduser()
    secret_file = where.node.secret_file or state / "swarm.key"
    write_private(secret_file, invite.secret.hex() + "\n", "swarm secret")
    if invite.token is None:
        return KeptFiles(secret_file, None)
    token_file = where.api.token_file or state / "api.token"
    write_private(token_file, invite.token + "\n", "API token")
    return KeptFiles(secret_file, token_file)
