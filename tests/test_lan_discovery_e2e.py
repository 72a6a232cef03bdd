"""Nodes started with no --join find their swarm on the LAN by mDNS: three hosts in network
namespaces on one bridge (harness/netns.py) form one swarm, and a fourth with another secret
stays apart, though it hears them and they hear it. Skipped, with the reason, where
namespaces cannot be made (not root, no ip/tc/nft)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from harness.factories import write_tiny_llama
from harness.netns import Lab, unavailable
from harness.netns_swarm import all_see_all_alive, views_of
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.wire import generate_secret_file

UNAVAILABLE = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}"),
]

_START_S = 180.0  # seconds for three tiny nodes to start and find each other on two cores
_STRANGER = "another swarm ("  # what a node logs once it hears a swarm it does not join


async def test_hosts_without_join_form_one_swarm_and_a_stranger_stays_apart(
    tmp_path: Path,
) -> None:
    write_tiny_llama(tmp_path / "model", num_hidden_layers=4)
    runtime = RuntimeConfig(model=str(tmp_path / "model"), cache_dir=tmp_path / "cache")
    ModelContext.open(runtime, progress=False)  # convert once, before the nodes start
    ours = generate_secret_file(tmp_path / "swarm.key")
    theirs = generate_secret_file(tmp_path / "other.key")
    state = tmp_path / "state"
    flags = ["--threads", "1"]
    with Lab(4) as lab:
        addresses = [lab.start_node(i, runtime, state, ours, flags) for i in range(3)]
        await until(
            lambda: all_see_all_alive(addresses),
            "three hosts without --join seeing each other alive",
            _START_S,
            every_s=0.5,
            ignoring=(aiohttp.ClientError, OSError),
        )
        stranger = lab.start_node(3, runtime, state, theirs, flags)

        def heard(i: int) -> bool:
            log = state / f"host{i}.log"
            return _STRANGER in log.read_text(errors="replace")

        for i in range(4):  # the stranger hears the three, each of the three hears it
            await until(lambda i=i: heard(i), f"host {i} hearing the other swarm", _START_S)
        *views, alone = await views_of([*addresses, stranger])
        assert all(set(view) == set(addresses) for view in views), views
        assert set(alone) == {stranger}, alone
        logs = "".join((state / f"host{i}.log").read_text() for i in range(4))
        assert "Traceback" not in logs
