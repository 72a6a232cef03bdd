"""The swarm secret, derived keys, counters and the replay window."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm.errors import ConfigError, FrameError, SecretError
from swarm.wire.auth import (
    SECRET_BYTES,
    MessageCounter,
    ReplayWindow,
    SwarmKeys,
    compute_tag,
    generate_secret,
    generate_secret_file,
    load_secret,
    verify_tag,
)


def test_generated_file_is_private_hex_and_loads(tmp_path: Path) -> None:
    path = generate_secret_file(tmp_path / "conf" / "secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert len(text) == 2 * SECRET_BYTES + 1 and text.endswith("\n")
    secret = load_secret(path)
    assert secret == bytes.fromhex(text.strip()) and len(secret) == SECRET_BYTES


def test_generate_refuses_to_replace_unless_told(tmp_path: Path) -> None:
    path = generate_secret_file(tmp_path / "secret")
    first = load_secret(path)
    with pytest.raises(SecretError, match="already exists"):
        generate_secret_file(path)
    assert load_secret(path) == first
    generate_secret_file(path, overwrite=True)
    assert load_secret(path) != first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary left behind


def test_generate_reports_unwritable_places(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SecretError, match="cannot write"):
        generate_secret_file(blocker / "secret")


def test_secrets_are_random() -> None:
    assert generate_secret() != generate_secret()
    assert len(generate_secret()) == SECRET_BYTES


def test_load_from_environment_wins_and_is_checked(tmp_path: Path) -> None:
    secret = generate_secret()
    file = generate_secret_file(tmp_path / "secret")
    assert load_secret(file, env_value=f" {secret.hex()}\n") == secret
    assert load_secret(None, env_value=secret.hex().upper()) == secret
    assert load_secret(file, env_value="") == load_secret(file)
    with pytest.raises(SecretError, match="64 hex characters"):
        load_secret(env_value="abcd")
    with pytest.raises(SecretError, match="not hexadecimal"):
        load_secret(env_value="zz" * SECRET_BYTES)
    assert load_secret() is None


def test_load_raw_file_and_clear_errors(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    secret = generate_secret()
    raw.write_bytes(secret)
    raw.chmod(0o600)
    assert load_secret(raw) == secret
    short = tmp_path / "short"
    short.write_text("abcd\n")
    with pytest.raises(SecretError, match="has 5 bytes"):
        load_secret(short)
    with pytest.raises(SecretError, match="swarm keygen"):
        load_secret(tmp_path / "missing")
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(tmp_path)  # a folder
    assert issubclass(SecretError, ConfigError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_load_unreadable_file(tmp_path: Path) -> None:
    path = generate_secret_file(tmp_path / "secret")
    path.chmod(0)
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(path)


def test_keys_are_separate_deterministic_and_hidden() -> None:
    secret = generate_secret()
    keys = SwarmKeys.derive(secret)
    assert keys.frame != keys.gossip and len(keys.frame) == 32
    assert SwarmKeys.derive(secret) == keys
    assert SwarmKeys.derive(generate_secret()).frame != keys.frame
    assert keys.frame.hex() not in repr(keys) and secret.hex() not in repr(keys)
    assert SwarmKeys.loopback() == SwarmKeys.loopback() != keys
    with pytest.raises(SecretError, match="32 bytes"):
        SwarmKeys.derive(b"short")


def test_tag_verifies_only_the_same_bytes_and_key() -> None:
    key, other = SwarmKeys.derive(generate_secret()).frame, generate_secret()
    tag = compute_tag(key, b"hello ", b"world")
    verify_tag(key, memoryview(b"hello world"), tag)
    with pytest.raises(FrameError, match="tag"):
        verify_tag(key, b"hello worle", tag)
    with pytest.raises(FrameError, match="tag"):
        verify_tag(other, b"hello world", tag)


def test_counter_increases_and_follows_the_clock() -> None:
    now = [5_000_000]
    counter = MessageCounter(lambda: now[0])
    assert [counter.next() for _ in range(3)] == [5000, 5001, 5002]
    now[0] = 9_000_000
    assert counter.next() == 9000
    now[0] = 1_000_000  # the clock steps back: counters still only grow
    assert counter.next() == 9001
    restarted = MessageCounter(lambda: 9_500_000)
    assert restarted.next() > 9001


def test_replay_window_accepts_each_counter_once() -> None:
    window = ReplayWindow(size=8, max_senders=10)
    window.accept("a", 100)
    with pytest.raises(FrameError, match="replay"):
        window.accept("a", 100)
    window.accept("a", 98)  # late but inside the window
    window.accept("a", 105)
    window.accept("a", 99)
    for counter in (98, 99, 105):
        with pytest.raises(FrameError, match="replay"):
            window.accept("a", counter)
    with pytest.raises(FrameError, match="too old"):
        window.accept("a", 97)  # 105 - 97 = 8: outside a window of 8
    window.accept("a", 10_000)  # a jump clears the window
    with pytest.raises(FrameError, match="too old"):
        window.accept("a", 105)
    window.accept("b", 100)  # senders are independent


def test_replay_window_forgets_least_recent_senders() -> None:
    window = ReplayWindow(size=8, max_senders=2)
    window.accept("a", 1)
    window.accept("b", 1)
    window.accept("a", 2)  # a is now more recent than b
    window.accept("c", 1)  # evicts b
    window.accept("b", 1)  # b was forgotten, so its counter is new again (documented)
    with pytest.raises(FrameError, match="replay"):
        window.accept("c", 1)  # c was kept (b's return evicted a)


def test_replay_window_spans_time_so_reordered_messages_pass() -> None:
    window = ReplayWindow(size=30_000_000, max_senders=10, max_seen=8)
    base = 1_700_000_000_000_000  # microseconds, as MessageCounter makes them
    late = [base + 5_000 * i for i in range(1, 6)]
    window.accept("a", base + 40_000)  # a newer message overtook five older ones
    for counter in late:
        window.accept("a", counter)
    with pytest.raises(FrameError, match="replay"):
        window.accept("a", late[2])
    for i in range(1, 8):  # the set fills: the oldest half is forgotten and refused
        window.accept("a", base + 40_000 + i)
    with pytest.raises(FrameError, match="too old"):
        window.accept("a", late[0])
    window.accept("a", base + 40_100)
