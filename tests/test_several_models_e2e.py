"""One machine, two models: `swarm node --model A --model B` as a user runs it, a process
that starts a node per model. Its port answers for both models with what one process
generates and lists both; a node that dies is named while the other keeps serving; SIGTERM
leaves cleanly. Starts that cannot work are refused in one line before anything loads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
import pytest

from harness.paths import REPO
from harness.polling import until
from harness.reference import generate_locally
from swarm import cli
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.errors import LinkError, StatusFormatError
from swarm.exits import WRONG_START

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SMOL = "smollm2-135m-instruct"
PROMPT = "Name three colours of the rainbow."
NEW_TOKENS = 8


def _free_run(count: int) -> int:
    """The first of `count` consecutive ports free on loopback."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port + count > 65536:
                continue
            with contextlib.ExitStack() as held:
                try:
                    for p in range(port + 1, port + count):
                        held.enter_context(socket.socket()).bind(("127.0.0.1", p))
                except OSError:
                    continue
        return int(port)


@dataclass
class Machine:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    tiny: str  # the tiny model's name
    texts: dict[str, str]  # model name -> what one process answers PROMPT

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def machine(
    smol_packed: RuntimeConfig, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Machine]:
    root = tmp_path_factory.mktemp("several")
    port = _free_run(4)
    log = root / "node.log"
    argv = ["node", "--preset", "local", "--port", str(port), "--state-dir", str(root)]
    argv += ["--cache-dir", str(smol_packed.cache_dir), "--threads", "1"]
    argv += ["--model", SMOL, "--model", str(tiny_gguf)]
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "swarm", *argv],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        tiny = RuntimeConfig(model=str(tiny_gguf), cache_dir=smol_packed.cache_dir, threads=1)
        texts = {  # while the nodes start
            SMOL: asyncio.run(generate_locally(smol_packed, [PROMPT], NEW_TOKENS))[0].text,
            tiny_gguf.stem: asyncio.run(generate_locally(tiny, [PROMPT], NEW_TOKENS))[0].text,
        }
        machine = Machine(process, port, log, tiny_gguf.stem, texts)
        asyncio.run(_both_served(machine))
        yield machine
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _both_served(machine: Machine) -> None:
    client = SwarmClient(machine.address)

    async def listed() -> bool:
        models = (await client.status()).models
        return len(models) == 2 and all(m.coverage.complete for m in models)

    def what() -> str:
        return f"both models served at {machine.address}: {machine.log.read_text()[-2000:]}"

    await until(listed, what, 120, every_s=0.2, ignoring=(LinkError, StatusFormatError))


async def _answer(http: aiohttp.ClientSession, address: str, model: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
    }
    async with http.post(f"http://{address}/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        text: str = (await r.json())["choices"][0]["message"]["content"]
    return text


async def test_the_port_answers_both_models_as_one_process_does_and_lists_both(
    machine: Machine,
) -> None:
    both = sorted([SMOL, machine.tiny])
    async with aiohttp.ClientSession() as http:
        for name, text in machine.texts.items():
            assert await _answer(http, machine.address, name) == text, name
        async with http.get(f"http://{machine.address}/v1/models") as r:
            assert sorted(m["id"] for m in (await r.json())["data"]) == both
        async with http.get(f"http://{machine.address}/api/tags") as r:
            tags = sorted(m["name"] for m in (await r.json())["models"])
        assert tags == [f"{name}:latest" for name in both]
    status = await SwarmClient(machine.address).status()
    assert sorted(m.name for m in status.models) == both
    assert sorted(m.address for m in status.members) == [
        machine.address,
        f"127.0.0.1:{machine.port + 2}",
    ]


async def test_a_node_that_dies_is_named_and_the_other_keeps_serving(machine: Machine) -> None:
    folder = f"models/{machine.tiny}/"
    nodes = psutil.Process(machine.process.pid).children()
    tiny = next(p for p in nodes if any(folder in word for word in p.cmdline()))
    tiny.kill()
    said = (
        f"model {machine.tiny}'s node (port {machine.port + 2}) was killed by signal 9; "
        f"still serving: {SMOL}"
    )
    await until(lambda: said in machine.log.read_text(), said, 30)
    async with aiohttp.ClientSession() as http:
        assert await _answer(http, machine.address, SMOL) == machine.texts[SMOL]


def test_sigterm_leaves_cleanly_and_the_exit_status_says_a_node_had_died(
    machine: Machine,
) -> None:
    """Runs last: the machine stops."""
    nodes = psutil.Process(machine.process.pid).children()
    machine.process.send_signal(signal.SIGTERM)
    assert machine.process.wait(60) == 1  # the tiny model's node was killed before
    said = machine.log.read_text()
    assert f"model {SMOL}'s node (port {machine.port}) exited with code 0" in said
    assert "Traceback" not in said
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in nodes)
    with contextlib.ExitStack() as held:  # every port free again
        for port in range(machine.port, machine.port + 4):
            sock = held.enter_context(socket.socket())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a node binds
            sock.bind(("127.0.0.1", port))


def _refused(capsys: pytest.CaptureFixture[str], *args: str, fragment: str) -> None:
    """`swarm node *args` (in this process: it ends before any node starts) exits 2 saying
    why in one line, its last, holding `fragment`."""
    assert cli.main(["node", *args]) == WRONG_START
    said = capsys.readouterr().err
    errors = [line for line in said.splitlines() if line.startswith("swarm: error: ")]
    assert len(errors) == 1 and said.rstrip().endswith(errors[0]) and fragment in errors[0], said


def test_the_same_model_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, "--model", SMOL, "--model", SMOL, fragment=f"model {SMOL!r} is given twice")


def test_the_same_model_twice_in_models_tables_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "bootstrap.toml"
    config.write_text(f'[[models]]\nmodel = "{SMOL}"\n\n[[models]]\nmodel = "{SMOL}"\n')
    _refused(capsys, "--config", str(config), fragment=f"model {SMOL!r} is given twice")


def test_memory_that_cannot_hold_both_is_refused_naming_each_models_bytes(
    capsys: pytest.CaptureFixture[str], tiny_gguf: Path
) -> None:
    _refused(
        capsys,
        *("--model", SMOL, "--model", str(tiny_gguf), "--layer-memory-bytes", "1MB"),
        fragment=f"cannot hold a layer of each model: {SMOL}'s 30 layers take ",
    )


def test_a_taken_port_of_the_second_model_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], tiny_gguf: Path
) -> None:
    port = _free_run(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 2))
        taken.listen()
        _refused(
            capsys,
            *("--port", str(port), "--model", SMOL, "--model", str(tiny_gguf)),
            fragment=f"{tiny_gguf.stem}'s port {port + 2} is already in use by pid {os.getpid()}",
        )
