"""`swarm doctor` against real faults on separate hosts (network namespaces on a bridge,
harness/netns.py), all in one lab, asked from the bridge as from an admin's laptop:

    host 0  healthy, the bootstrap
    host 1  another model, pinned to half its layers (the rest served by no one); its firewall
            drops its fast port, and new connections from host 0 (its frames reach host 0,
            host 0's never reach it)
    host 2, host 3  both --advertise an address that only a bridge of each holds
    host 4  another swarm secret
    host 5  its frames' clock two minutes ahead (net.test_clock_offset_s)

Skipped, with the reason, where namespaces cannot be made (not root, no ip/tc/nft)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.factories import write_tiny_llama
from harness.netns import API_TOKEN, PORT, Lab, unavailable
from harness.netns_swarm import node_status
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.wire import generate_secret_file

UNAVAILABLE = unavailable()

SHARED = "172.31.254.1"  # what hosts 2 and 3 both advertise, as a docker0 bridge would be
CLOCK_AHEAD_S = 120.0
_SETTLE_S = 150.0  # seconds for six tiny nodes to start and show their faults on two cores


def _doctor(root: Path, node: str, *flags: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "swarm", "doctor", "--node", node, *flags]
    args += ["--api-token-file", str(root / "api.token"), "--secret-file", str(root / "swarm.key")]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=root)


def _doctor_into_head(root: Path, node: str) -> subprocess.CompletedProcess[str]:
    """`swarm doctor ... | head -1`: its reader goes away after the first line."""
    command = f"{sys.executable} -m swarm doctor --node {node} --api-token-file api.token"
    return subprocess.run(
        f"{command} | head -1", shell=True, capture_output=True, text=True, timeout=60, cwd=root
    )


def _verdicts(done: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    assert done.returncode == 1, done.stderr
    verdicts: list[dict[str, str]] = json.loads(done.stdout)["verdicts"]
    return verdicts


def _one(verdicts: list[dict[str, str]], level: str, check: str, *words: str) -> str:
    found = [
        v["message"]
        for v in verdicts
        if v["level"] == level and v["check"] == check and all(w in v["message"] for w in words)
    ]
    assert len(found) == 1, (level, check, words, verdicts)
    return found[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}")
async def test_doctor_names_each_fault_and_its_fix(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "model", num_hidden_layers=4)
    write_tiny_llama(tmp_path / "other", seed=1, num_hidden_layers=4)
    cache = tmp_path / "cache"
    ours = RuntimeConfig(model=str(tmp_path / "model"), cache_dir=cache)
    other = RuntimeConfig(model=str(tmp_path / "other"), cache_dir=cache)
    for runtime in (ours, other):
        ModelContext.open(runtime, progress=False)  # convert once, before the nodes start
    key = generate_secret_file(tmp_path / "swarm.key")
    stranger_key = generate_secret_file(tmp_path / "stranger.key")
    (tmp_path / "api.token").write_text(API_TOKEN)
    state = tmp_path / "state"
    flags = ["--threads", "1", "--no-discover"]
    with Lab(6) as lab:
        ip = [h.ip for h in lab.hosts]
        lab.firewall(
            1, ["tcp dport 7421 drop", f"ip saddr {ip[0]} tcp dport {PORT} ct state new drop"]
        )
        for i in (2, 3):
            lab.add_address(i, "docker0", SHARED)
        bootstrap = lab.start_node(0, ours, state, key, flags)
        lab.start_node(1, other, state, key, [*flags, "--span", "0:2"], bootstrap)
        for i in (2, 3):
            lab.start_node(
                i, ours, state, key, [*flags, "--advertise", f"{SHARED}:{PORT}"], bootstrap
            )
        lab.start_node(4, ours, state, stranger_key, flags, bootstrap)
        clock = {"SWARM_NET_TEST_CLOCK_OFFSET_S": str(CLOCK_AHEAD_S)}
        lab.start_node(5, ours, state, key, flags, bootstrap, clock)

        async def faults_show() -> dict[str, Any] | None:
            status = await node_status(bootstrap)
            # a list, not a set: hosts 2 and 3 share an address, and often their state too
            states = [(m["address"], m["state"]) for m in status["members"]]
            refused = {(r["peer"], r["reason"]) for r in status["refused_from"]}
            shared = [a for a, _ in states if a == f"{SHARED}:{PORT}"]
            host1 = {s for a, s in states if a == lab.hosts[1].address}
            ready = (
                len(shared) == 2
                and host1 & {"suspect", "dead"}
                and {(ip[4], "wrong_key"), (ip[5], "clock")} <= refused
            )
            return status if ready else None

        status = await until(
            faults_show, "the faults showing in host 0's status", _SETTLE_S, every_s=0.5,
            ignoring=(aiohttp.ClientError, OSError),
        )  # fmt: skip
        ids = {m["address"]: m["id"] for m in status["members"]}

        # each asks one node and changes nothing, so they run side by side: on two cores
        # their imports and connect timeouts, one after another, were most of this test
        asked, alone_asked, ahead_asked, text, nobody, closed = await asyncio.gather(
            asyncio.to_thread(_doctor, tmp_path, bootstrap, "--json"),
            asyncio.to_thread(_doctor, tmp_path, lab.hosts[4].address, "--json"),
            asyncio.to_thread(_doctor, tmp_path, lab.hosts[5].address, "--json"),
            asyncio.to_thread(_doctor, tmp_path, bootstrap),
            asyncio.to_thread(_doctor, tmp_path, f"{lab.hosts[0].ip}:{PORT + 9}"),
            asyncio.to_thread(_doctor_into_head, tmp_path, bootstrap),
        )
        verdicts = _verdicts(asked)
        host1 = ids[lab.hosts[1].address]
        _one(verdicts, "FAIL", "fast_port", host1, "port 7421", "ufw allow 7420:7421/tcp")
        _one(verdicts, "FAIL", "reach_back", host1, ids[bootstrap], "though this machine reaches")
        _one(verdicts, "FAIL", "duplicate_address", f"{SHARED}:{PORT}", "--advertise")
        _one(verdicts, "FAIL", "refused", f"{ip[4]} (not a member)", "another swarm secret")
        _one(verdicts, "FAIL", "refused", f"{ip[5]} (not a member)", "run NTP")
        _one(
            verdicts, "FAIL", "coverage", "layers 2:4 served by no live member", f"as {host1} sees"
        )
        _one(verdicts, "ok", "fast_port", ids[bootstrap], "fast port 7421 answers")
        _one(verdicts, "ok", "key", ids[bootstrap], "takes frames sealed with this secret")
        _one(verdicts, "ok", "address", f"{ids[bootstrap]} advertises", "(the bound address)")

        alone = _verdicts(alone_asked)
        _one(alone, "FAIL", "key", "it runs with another key")
        ahead = _verdicts(ahead_asked)
        _one(ahead, "FAIL", "clock", "its clock is +1", "beyond the frames' window of 2 s")
        _one(ahead, "FAIL", "key", "clocks apart")

        lines = text.stdout.splitlines()
        assert text.returncode == 1 and lines, text.stderr
        assert all(line.split()[0] in ("ok", "warn", "FAIL") for line in lines), lines
        assert nobody.returncode == 1 and len(nobody.stdout.splitlines()) == 1, nobody
        assert nobody.stdout.startswith("FAIL node") and not nobody.stderr
        assert len(closed.stdout.splitlines()) == 1 and "Traceback" not in closed.stderr, closed
        logs = "".join((state / f"host{i}.log").read_text() for i in range(6))
        assert "Traceback" not in logs
