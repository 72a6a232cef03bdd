"""Wrong starts of `swarm` as a new user meets them on loopback, each a real process: one line
on stderr and exit status 2, never a traceback; and what used to end in one: two nodes on
adjacent ports, a --join address that answers only later, a reader of stdout that goes away.
The decisions behind them are tables in tests/test_start_checks.py."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.commands import one_line_error, swarm_command
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.demo import NodeProcess, start_node, stop_nodes
from swarm.exits import BROKEN_PIPE, WRONG_START

_NODE = ("node", "--preset", "local")
_START_S = 120.0  # seconds a tiny model's node may take to start on a busy two-core machine


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_taken_port_is_one_line_naming_the_port_and_its_holder(
    held_port: int, tmp_path: Path
) -> None:
    state = ("--state-dir", str(tmp_path))
    taken = swarm_command(*_NODE, *state, "--port", str(held_port), cache=tmp_path)
    one_line_error(taken, WRONG_START, f"port {held_port} is already in use by pid {os.getpid()}")
    fast = swarm_command(*_NODE, *state, "--port", "0", "--fast-port", str(held_port))
    one_line_error(fast, WRONG_START, f"fast port {held_port} is already in use", "--fast-port")


@pytest.mark.parametrize("model", ["/no/such.gguf", "notes.txt"])
def test_a_model_path_that_is_no_model_is_what_pull_says(model: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("milk, eggs\n")  # an existing file that is no model
    cache = tmp_path / "cache"
    node = swarm_command(
        *_NODE,
        "--port",
        "0",
        "--state-dir",
        str(tmp_path),
        "--model",
        model,
        cache=cache,
        cwd=tmp_path,
    )
    pull = swarm_command("pull", model, cache=cache, cwd=tmp_path)
    assert one_line_error(node, WRONG_START, model) == one_line_error(pull, WRONG_START)


def test_a_reader_that_goes_away_ends_a_command_quietly() -> None:
    with _closed_pipe() as stdout:
        shown = swarm_command("config", stdout=stdout, timeout=60)
    assert (shown.returncode, shown.stderr) == (BROKEN_PIPE, "")


def test_keygen_writes_a_file_only_its_owner_may_open(tmp_path: Path) -> None:
    made = swarm_command("keygen", str(tmp_path / "swarm.key"), timeout=60)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE((tmp_path / "swarm.key").stat().st_mode) == 0o600


async def test_two_nodes_on_adjacent_ports_and_a_join_address_that_answers_later(
    tiny_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    """The first node takes port p and is told to join through p + 1, where nothing listens
    yet: it must not take p + 1 for its fast links, and it says every few seconds that it
    serves alone. Then the second node starts on p + 1, and the first joins it. Both read a
    secret and a token file that anyone may read, and say so once."""
    port = _adjacent_free_ports()
    secret, token = tmp_path / "swarm.key", tmp_path / "api.token"
    assert swarm_command("keygen", str(secret), timeout=60).returncode == 0
    token.write_text("not-a-real-token\n")
    for path in (secret, token):
        path.chmod(0o644)  # what `> api.token` makes under umask 022
    files = ["--secret-file", str(secret), "--api-token-file", str(token), "--threads", "1"]
    state = tmp_path / "state"
    nodes: list[NodeProcess] = []
    first, second = state / f"node-{port}.log", state / f"node-{port + 1}.log"
    try:
        nodes.append(start_node(port, f"127.0.0.1:{port + 1}", state, tiny_runtime, files))
        warning = f"cannot join through 127.0.0.1:{port + 1} (connection refused): serving alone"
        await until(
            lambda: _log(first).count(warning) >= 2,
            lambda: f"the warning twice in {_log(first)!r}",
            _START_S,
        )
        started = _started_line(_log(first))
        assert started.startswith(f"listening on 127.0.0.1:{port}, fast links on port ")
        assert not started.endswith(f" {port + 1}")
        for setting, path in (("node.secret_file", secret), ("api.token_file", token)):
            line = f"{setting} {path} is open to users other than its owner (mode 0644): "
            assert _log(first).count(line + f"run chmod 600 {path}") == 1, _log(first)
        nodes.append(start_node(port + 1, None, state, tiny_runtime, files))
        await until(
            lambda: "joined the swarm" in _log(first),
            lambda: f"the first node joining, in {_log(first)!r}",
            _START_S,
        )
        assert "Traceback" not in _log(first) + _log(second)
        with _closed_pipe() as stdout:
            asked = swarm_command(
                "status",
                "--node",
                f"127.0.0.1:{port + 1}",
                "--api-token-file",
                str(token),
                stdout=stdout,
                timeout=60,
            )
        assert (asked.returncode, asked.stderr) == (BROKEN_PIPE, "")
    finally:
        stop_nodes(nodes)


def _adjacent_free_ports() -> int:
    """A port p with p + 1 free as well, as a user picks 18101 and 18102."""
    for _ in range(100):
        with socket.socket() as low, socket.socket() as high:
            low.bind(("127.0.0.1", 0))
            port = low.getsockname()[1]
            with contextlib.suppress(OSError):
                high.bind(("127.0.0.1", port + 1))
                return int(port)
    raise AssertionError("no two adjacent free ports")


@contextlib.contextmanager
def _closed_pipe() -> Iterator[int]:
    """A pipe's writing end whose reader has gone, as `| head -2`'s after two lines."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _started_line(log: str) -> str:
    """The node's start line, after `swarm node <id> `."""
    line = next(x for x in log.splitlines() if x.startswith("swarm node "))
    return line.split(" ", 3)[3]
