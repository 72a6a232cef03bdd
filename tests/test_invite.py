"""Invite lines: what one carries and gives back, and each way a line goes wrong (cut,
mistyped, edited, expired) as one InviteError naming it; the files a node keeps from one.
The line through real nodes is tests/test_invite_e2e.py."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import msgpack
import pytest

from swarm import cli
from swarm.config import Config, NodeConfig, invite_from_environment
from swarm.errors import ConfigError, InviteError
from swarm.invite import (
    PREFIX,
    Invite,
    decode_invite,
    encode_invite,
    join_addresses,
    keep_invite,
    kept_by_an_invite,
    parse_duration,
)
from swarm.wire import generate_secret, load_secret

NOW = 1_800_000_000.0
SECRET = generate_secret()
INVITE = Invite(SECRET, "a-token", ("192.168.1.10:7420", "[fd00::2]:7420"), int(NOW) + 3600)


def _raw(line: str) -> bytes:
    encoded = line[len(PREFIX) :]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))


def _line(raw: bytes) -> str:
    return PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "invite",
    [
        INVITE,
        Invite(SECRET, None, ("10.0.0.1:7420",), None),  # no token, no expiry
        Invite(SECRET, "t", ("a:1", "b:2", "c:3", "d:4"), int(NOW) + 1),
    ],
)
def test_a_line_gives_back_what_it_carries(invite: Invite) -> None:
    line = encode_invite(invite)
    assert line.startswith(PREFIX) and len(line.split()) == 1 and len(line) < 300
    assert decode_invite(f"  {line}\n", NOW) == invite
    assert SECRET.hex() not in repr(invite) and "a-token" not in repr(invite)


def _tampered(field: str, value: object) -> str:
    packed = _raw(encode_invite(INVITE))[:-16]
    body = msgpack.unpackb(packed)
    body[field] = value
    return _line(msgpack.packb(body, use_bin_type=True) + _raw(encode_invite(INVITE))[-16:])


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("", "an invite line starts with swarm://"),
        ("https://example.invalid/x", "starts with swarm://"),
        (PREFIX + "x" * 5000, "starts with swarm://"),
        (PREFIX + "a!b", "not base64url"),
        (PREFIX + "abcde", "not base64url"),
        (PREFIX, "cut or mistyped"),
        (encode_invite(INVITE)[:-20], "cut or mistyped"),
        (_line(msgpack.packb({"v": 2}) + bytes(16)), "another swarm version"),
        (_line(msgpack.packb({"v": 1, "secret": b"short", "join": ["a:1"]}) + bytes(16)), "wrong"),
        (_line(msgpack.packb({"v": 1, "secret": SECRET, "join": []}) + bytes(16)), "wrong"),
        (_line(msgpack.packb({"v": 1, "secret": SECRET, "join": ["nope"]}) + bytes(16)), "'nope'"),
        (_tampered("expires", int(NOW) + 10 * 86400), "changed after it was made"),
        (_tampered("join", ["203.0.113.9:7420"]), "changed after it was made"),
        (_tampered("token", "another"), "changed after it was made"),
        (_tampered("secret", generate_secret()), "changed after it was made"),
        (_line(_raw(encode_invite(INVITE))[:-1] + b"\0"), "changed after it was made"),
        (encode_invite(Invite(SECRET, None, ("a:1",), int(NOW))), "expired at "),
        (encode_invite(Invite(SECRET, None, ("a:1",), int(NOW) - 60)), "ask for a new one"),
    ],
)
def test_a_wrong_line_is_one_error_saying_what(line: str, said: str) -> None:
    with pytest.raises(InviteError, match=None) as caught:
        decode_invite(line, NOW)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # a wrong start: exit status 2


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("1h", 3600), (" 7d ", 7 * 86400)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "h", "0h", "1.5h", "-1h", "1w", "1 hour"])
def test_a_duration_that_is_none_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--expires"):
        parse_duration(text)


def test_a_line_carries_the_node_then_other_live_members() -> None:
    members = [
        ("10.0.0.1:7420", "alive"),  # the node itself, listed too
        ("10.0.0.2:7420", "dead"),
        ("10.0.0.3:7420", "alive"),
        ("10.0.0.4:7420", "suspect"),
        *((f"10.0.1.{i}:7420", "alive") for i in range(9)),
    ]
    assert join_addresses("10.0.0.1:7420", members) == (
        "10.0.0.1:7420",
        "10.0.0.3:7420",
        "10.0.1.0:7420",
        "10.0.1.1:7420",
    )


def test_a_node_keeps_the_secret_and_token_for_its_owner_only(tmp_path: Path) -> None:
    where = Config(node=NodeConfig(state_dir=tmp_path / "state"))
    kept = keep_invite(INVITE, where)
    assert kept.secret_file == tmp_path / "state" / "swarm.key"
    assert kept.token_file == tmp_path / "state" / "api.token"
    for path in (kept.secret_file, kept.token_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(kept.secret_file) == SECRET
    assert kept.token_file.read_text().strip() == "a-token"
    kept.secret_file.chmod(0o644)
    assert keep_invite(INVITE, where) == kept  # the same line again: nothing changes
    assert stat.S_IMODE(kept.secret_file.stat().st_mode) == 0o600
    other = Invite(generate_secret(), None, ("a:1",), None)
    with pytest.raises(ConfigError, match="holds another swarm secret"):
        keep_invite(other, where)
    assert load_secret(kept.secret_file) == SECRET  # never replaced


def test_files_the_config_names_are_where_they_go(tmp_path: Path) -> None:
    key = tmp_path / "elsewhere" / "my.key"
    where = Config(node=NodeConfig(state_dir=tmp_path, secret_file=key))
    kept = keep_invite(Invite(SECRET, None, ("a:1",), None), where)
    assert (kept.secret_file, kept.token_file) == (key, None)
    assert load_secret(key) == SECRET and not (tmp_path / "api.token").exists()


def test_the_environment_may_hold_the_line() -> None:
    assert invite_from_environment({"SWARM_INVITE": " swarm://x \n"}) == "swarm://x"
    assert invite_from_environment({"SWARM_INVITE": " "}) is None
    assert invite_from_environment({}) is None


def test_a_node_invited_once_starts_again_with_what_the_invite_kept(tmp_path: Path) -> None:
    state = tmp_path / "state"
    where = Config(node=NodeConfig(state_dir=state))
    assert kept_by_an_invite(where) is None  # never invited: loopback only, as before
    kept = keep_invite(INVITE, where)
    assert kept_by_an_invite(where) == kept
    named = tmp_path / "named.key"
    assert kept_by_an_invite(Config(node=NodeConfig(state_dir=state, secret_file=named))) is None
    args = cli._parser().parse_args(["node", "--state-dir", str(state), "--host", "0.0.0.0"])
    config = cli._config_from(args)  # a restart with no line and no flags for the files
    assert config.node.secret_file == kept.secret_file
    assert config.api.token_file == kept.token_file
