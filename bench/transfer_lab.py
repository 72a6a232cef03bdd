"""Weights over a real link: the namespace lab (harness/netns.py, as root). Host 0 has the
embedded model's file; host 1 (uncapped) and then host 2 (its link capped at 100 Mbit/s by
tbf) start with only the model's id, fetch what the plan gives them from their peers, and
serve. Prints, for each, the bytes fetched, the fetch rate and the seconds from the process
start to serving its span.

    sudo python -m bench.transfer_lab   (from the repo root)
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path

from harness.netns import API_TOKEN, Lab, unavailable
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.wire.auth import generate_secret_file

CAPS = {1: None, 2: 100}  # host -> Mbit/s of its link (None: the bridge's own speed)


async def _serving(entry: str, address: str, limit_s: float = 600) -> None:
    client = SwarmClient(entry, token=API_TOKEN)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status = await client.status()
        if any(m.address == address and m.span for m in status.members):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{address} did not serve within {limit_s} s")


async def main() -> None:
    why = unavailable()
    if why is not None:
        raise SystemExit(f"the namespace lab is unavailable: {why}")
    with tempfile.TemporaryDirectory(prefix="swarm-bench-transfer-") as tmp, Lab(3) as lab:
        root = Path(tmp)
        secret = generate_secret_file(root / "swarm.key")
        runtime = RuntimeConfig(cache_dir=root / "c0")
        flags = ["--threads", "1"]
        first = lab.start_node(0, runtime, root, secret, flags)
        status = await wait_for_coverage(first, 1, 600, API_TOKEN)
        model_id = status.model.id
        for host, mbit in CAPS.items():
            if mbit is not None:
                lab.cap(host, mbit)
            fetching = dataclasses.replace(
                runtime, model=model_id[:16], cache_dir=root / f"c{host}"
            )
            started = time.monotonic()
            address = lab.start_node(host, fetching, root, secret, flags, first)
            await _serving(first, address)
            took = time.monotonic() - started
            report = (await SwarmClient(address, token=API_TOKEN).status()).transfer
            link = "uncapped" if mbit is None else f"{mbit} Mbit/s tbf"
            print(
                f"host {host} ({link}): fetched {report.bytes_done / 1e6:.1f} MB in "
                f"{report.parts_done} parts, last fetch {report.bytes_per_s / 1e6:.1f} MB/s; "
                f"{took:.1f} s from start to serving",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
