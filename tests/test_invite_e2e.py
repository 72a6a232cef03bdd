"""An invite line through real node processes on loopback: `swarm invite` on a member prints
one line, and a node started with it and a fresh state folder joins that swarm, keeps the
secret and token in files only its owner may open, and serves. A line that is not right
stops `swarm node` with one line and exit status 2, as every wrong start does."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from harness.commands import one_line_error, swarm_command
from harness.polling import until
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.exits import WRONG_START
from swarm.invite import Invite, encode_invite
from swarm.wire import generate_secret, generate_secret_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

_START_S = 120.0  # seconds a tiny model's node may take to start on a busy two-core machine
TOKEN = "invite-test-token"


async def test_a_node_started_with_an_invite_joins_and_serves(
    tiny_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    secret = generate_secret_file(tmp_path / "swarm.key")
    token = tmp_path / "api.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    files = ["--secret-file", str(secret), "--api-token-file", str(token)]
    first, second = free_ports(2)
    nodes = []
    try:
        nodes.append(start_node(first, None, tmp_path / "a", tiny_runtime, files))
        await wait_for_coverage(f"127.0.0.1:{first}", 1, _START_S, TOKEN)
        made = swarm_command(
            "invite", "--node", f"127.0.0.1:{first}", *files, "--expires", "1h", timeout=60
        )
        assert made.returncode == 0, made.stderr
        (line,) = made.stdout.splitlines()
        assert line.startswith("swarm://") and secret.read_text().strip() not in line
        assert "only this machine can use the line" in made.stderr  # a loopback address

        fresh = tmp_path / "b"
        nodes.append(start_node(second, None, fresh, tiny_runtime, ["--invite", line]))
        members = SwarmClient(f"127.0.0.1:{first}", token=TOKEN)

        async def both_alive() -> bool:
            status = await members.status()
            return sorted(m.state for m in status.members) == ["alive", "alive"]

        await until(both_alive, "the invited node joining", _START_S, every_s=0.5)
        for name, text in (("swarm.key", secret.read_text()), ("api.token", TOKEN + "\n")):
            kept = fresh / name
            assert kept.read_text() == text
            assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        asked = swarm_command(
            *("generate", "--node", f"127.0.0.1:{second}", "--raw", "--prompt", "w1 w2"),
            *("--max-tokens", "3", "--api-token-file", str(fresh / "api.token")),
            timeout=120,
        )
        assert asked.returncode == 0, asked.stderr
        assert "[route " in asked.stderr
        log = (fresh / f"node-{second}.log").read_text()
        assert "invited: kept the swarm secret in" in log and "Traceback" not in log
    finally:
        stop_nodes(nodes)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("swarm://not-a-line", "cut or mistyped"),
        ("http://192.168.1.10:7420", "starts with swarm://"),
        (
            encode_invite(Invite(generate_secret(), None, ("127.0.0.1:9",), int(time.time()) - 1)),
            "expired at",
        ),
        (
            encode_invite(Invite(generate_secret(), None, ("127.0.0.1:9",), None))[:-3] + "AAA",
            "changed",
        ),
    ],
)
def test_a_wrong_line_is_a_wrong_start(line: str, said: str, tmp_path: Path) -> None:
    started = swarm_command(
        "node", "--preset", "local", "--port", "0", "--state-dir", str(tmp_path), "--invite", line
    )
    one_line_error(started, WRONG_START, "invite line", said)
    assert not (tmp_path / "swarm.key").exists()
