"""Replays that a fault starts together resume together: three node processes on the embedded
model (the entry with layers 0:15, a hop with 15:30, and a spare for 15:30 that starts once all
eight streams have their route through the hop), the hop killed (-9) once every stream
decodes. Every stream replays its whole history on the spare at the same time; their prefill
chunks run batched there, the least advanced first, so the last stream resumes within 1.5x the
median stall (one after another, eight replays would spread ~1.8x), and every text is what one
process makes.

The median, not the first: a stream whose step was on the wire when the hop died hears of it
first, and under load its replay's first chunks can run before the others' failures reach the
entry (one suite run saw two streams 80 ms ahead resume after 1.7 s, the six others after
3.4-3.7 s)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from pathlib import Path

import pytest

from harness.cluster import Cluster
from harness.reference import generate_locally
from harness.replays import PROMPTS, concurrent_replays
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, wait_for_coverage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Long enough for the spare to start while the streams decode, under load too (it serves about
# when their prompts' prefill ends, so the kill comes a few tokens in), and to leave each stream
# ~90 tokens after its replay, where a cache rebuilt with other bits sends greedy text elsewhere
# within a few. Each token costs eight decode steps here and in the reference.
TOKENS = 96


def test_eight_replays_resume_together_and_exactly(
    smol_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    one_thread = dataclasses.replace(smol_runtime, threads=1)
    references = asyncio.run(generate_locally(one_thread, PROMPTS, TOKENS))
    flags = [["--threads", "1", "--span", span] for span in ("0:15", "15:30", "15:30")]
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    cluster = Cluster(addresses, runtime=smol_runtime, state_dir=tmp_path / "state", flags=flags)

    async def start_spare() -> None:
        await asyncio.to_thread(cluster.start, 2)
        await wait_for_coverage(addresses[0], 3, 240)

    async def scenario() -> list[float]:
        for i in range(2):
            await asyncio.to_thread(cluster.start, i)
        await wait_for_coverage(addresses[0], 2, 240)
        streams = await concurrent_replays(
            addresses[0], PROMPTS, TOKENS, start_spare, cluster.processes[1].kill
        )
        for stream, reference in zip(streams, references, strict=True):
            assert stream.text == reference.text
            assert [f.failed is not None for f in stream.failovers] == [True], stream.failovers
        # each stream's stall beside its re-route: a stream that stalled for no time had
        # nothing left that needed the killed hop (say why, should it happen)
        diagnosis.extend(
            f"{s.stall_ms:.0f} ms, {s.stream.tokens} chunks, {s.failovers}" for s in streams
        )
        return [s.stall_ms for s in streams]

    diagnosis: list[str] = []
    try:
        stalls = asyncio.run(scenario())
    finally:
        cluster.stop()
    print(f"\nstalls after the kill, ms: {' '.join(f'{s:.0f}' for s in sorted(stalls))}")
    assert max(stalls) <= 1.5 * statistics.median(stalls), "\n".join(diagnosis)
