"""The README's multi-machine recipe, verbatim, on three hosts (network namespaces on a bridge,
every link capped at 100 Mbit/s by tc tbf, as on a home LAN): every node bound to 0.0.0.0, the
first with a new secret and API token, the others with the line `swarm invite` printed there.
Each host runs from its own folder, whose bootstrap.toml (found without a flag) gives the layer
memory that forces a three-way split of the real model and keeps each host's state apart. A
fourth node that advertises an address nobody can reach says so within the failure-detection
time. Skipped, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import stat
import sys
from pathlib import Path

import pytest

from harness.netns import Lab, unavailable
from harness.polling import until
from harness.reference import generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.errors import LinkError
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

UNAVAILABLE = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}"),
]

SWARM = str(Path(sys.executable).parent / "swarm")  # the command `make setup` installs
PROMPT = "Hello"


def _host_folder(root: Path, i: int, cache: Path, layer_bytes: int) -> Path:
    folder = root / f"machine{i}"
    folder.mkdir()
    (folder / "bootstrap.toml").write_text(
        f'[runtime]\ncache_dir = "{cache}"\nlayer_memory_bytes = {layer_bytes}\nthreads = 1\n'
        f'[node]\nstate_dir = "{folder / "state"}"\n'
    )
    return folder


def _readme_commands(readme: str) -> list[str]:
    """The shell lines of the README's multi-machine section, without comments."""
    section = readme.split("## Running a swarm on your machines", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    lines = (" ".join(re.sub(r"\s+#.*$", "", line).split()) for line in joined.splitlines())
    return [line for line in lines if line]


def test_the_readme_recipe_forms_a_swarm_on_three_hosts(
    smol_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    commands = _readme_commands(readme)
    keygen, token, first, invite, others, status_cmd, generate_cmd = commands
    assert keygen == "swarm keygen swarm.key"
    assert token.startswith("head -c 24 /dev/urandom | base64 > api.token")
    assert first == ("swarm node --host 0.0.0.0 --secret-file swarm.key --api-token-file api.token")
    assert invite == "swarm invite --secret-file swarm.key --api-token-file api.token"
    assert others == "swarm node --host 0.0.0.0 --invite 'swarm://...'"

    # the recipe's nodes run the default dtype: so does the one-process reference
    runtime = dataclasses.replace(smol_runtime, dtype=RuntimeConfig().dtype)
    context = ModelContext.open(runtime, progress=False)
    layer_bytes = 11 * bytes_per_layer(context)  # 30 layers need all three machines
    (reference,) = asyncio.run(generate_locally(runtime, [PROMPT], 128))
    with Lab(4) as lab:
        lab.cap_all(100)
        folders = [_host_folder(tmp_path, i, smol_runtime.cache_dir, layer_bytes) for i in range(4)]
        # the secret and the token are made once, on the first machine
        for line in (keygen, token):
            done = lab.run_in(0, ["sh", "-c", line.replace("swarm ", f"{SWARM} ", 1)], folders[0])
            assert done.returncode == 0, done.stderr
        bootstrap = lab.hosts[0].address
        token_value = (folders[0] / "api.token").read_text().strip()
        lab.spawn(0, [SWARM, *first.split()[1:]], folders[0], folders[0] / "node.log")
        first_node = SwarmClient(bootstrap, token=token_value)
        answering = until(first_node.status, "the first node answering", 300, ignoring=(LinkError,))
        asyncio.run(answering)
        asked = lab.run_in(0, [SWARM, *invite.split()[1:]], folders[0])
        assert asked.returncode == 0, asked.stderr
        (invite_line,) = asked.stdout.splitlines()
        for i in (1, 2):  # the line pasted on the others
            argv = [a if a != "'swarm://...'" else invite_line for a in others.split()[1:]]
            lab.spawn(i, [SWARM, *argv], folders[i], folders[i] / "node.log")
        asyncio.run(wait_for_coverage(bootstrap, 3, 300, token_value))
        # start-up re-plans (each node's measured pace replaces its first probe) move spans
        # for a while; the recipe's checks start once the layout holds still
        asyncio.run(_settled(bootstrap, token_value, 240))

        addresses = {h.address for h in lab.hosts[:3]}
        for folder in folders[1:3]:
            _token_for_clients(folder)
        for i in range(3):
            own = lab.hosts[i].address
            status = lab.run_in(i, _as_argv(status_cmd, own), folders[i])
            assert status.returncode == 0, status.stderr
            assert "; complete" in status.stdout.splitlines()[0], status.stdout
            lines = status.stdout.splitlines()
            assert lines[1].startswith("throughput limited by "), status.stdout
            table = lines[lines.index(next(x for x in lines if x.startswith("id "))) + 1 :]
            # the member table ends at the first blank line (refusals may follow it)
            members = list(itertools.takewhile(bool, table))
            # columns: id, address, model, state, ...
            listed = {line.split()[1]: line.split()[3] for line in members}
            assert listed == dict.fromkeys(addresses, "alive"), status.stdout
            reach = {line.split()[1]: line.split()[-1] for line in members}
            assert reach == {a: "node)" if a == own else "yes" for a in addresses}, reach
            answer = lab.run_in(i, _as_argv(generate_cmd, own), folders[i])
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout == reference.text + "\n"
            assert answer.stderr.count("[hop ") == 3  # the route went through all three

        # a machine whose advertised address peers cannot reach says so, and keeps trying
        unreachable = lab.hosts[0].ip.rsplit(".", 1)[0] + ".250:7420"
        argv = [a if a != "'swarm://...'" else invite_line for a in others.split()[1:]]
        argv += ["--advertise", unreachable]
        lab.spawn(3, [SWARM, *argv], folders[3], folders[3] / "node.log")
        _wait_for_line(folders[3] / "node.log", "cannot reach its advertised address", 180)
        # the join answer told it where the bootstrap peer saw it connect from
        seen = f"sees this node connect from {lab.hosts[3].ip}, but it advertises {unreachable}"
        _wait_for_line(folders[3] / "node.log", seen, 10)
        _token_for_clients(folders[3])
        alone = lab.run_in(3, _as_argv(status_cmd, lab.hosts[3].address), folders[3])
        assert "WARNING: peers cannot reach this node" in alone.stdout, alone.stdout


def _token_for_clients(folder: Path) -> None:
    """An invited machine keeps the token in its state folder (mode 0600); its user points the
    recipe's client commands at it, here a copy where they look."""
    kept = folder / "state" / "api.token"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    (folder / "api.token").write_text(kept.read_text())


async def _settled(address: str, token: str, timeout_s: float) -> None:
    """Until every layer is covered and two looks 5 s apart see the same layout."""
    client = SwarmClient(address, token=token)
    last: object = None

    async def settled() -> bool:
        nonlocal last
        status = await client.status()
        layout = sorted((m.address, m.span, m.state) for m in status.members)
        same, last = layout == last, layout
        return status.coverage.complete and same

    await until(settled, "the swarm's layout settling", timeout_s, every_s=5)


def _as_argv(command: str, address: str) -> list[str]:
    argv = command.replace("192.168.1.10:7420", address).split()
    assert argv[0] == "swarm"
    # the README quotes the prompt: '--prompt "Hello"'
    return [SWARM, *(a.strip('"') for a in argv[1:])]


def _wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    def said() -> bool:
        return log.exists() and text in log.read_text(errors="replace")

    def what() -> str:
        return f"{log} saying {text!r} (it says:\n{log.read_text()})"

    asyncio.run(until(said, what, timeout_s, every_s=0.5))
