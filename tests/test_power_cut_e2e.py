"""A power cut in a home lab: every node of three killed -9 at once while an answer streams,
then each started again from its state folder with no --join, in each of the six orders.

The lab is built once per module (two of its nodes fetch their layers from the third); each
order is a cheap restart of the folders the last cut left, and ends with the next cut. Each
node starts once the one before it answers, so the order is real: the first ones knock on
addresses nobody answers yet."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cluster import Cluster
from harness.factories import write_tiny_llama
from harness.polling import until
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, wait_for_coverage
from swarm.errors import LinkError, StatusFormatError, SwarmError
from swarm.membership.address_book import AddressBook
from swarm.membership.served_span import read_served_span, span_file
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.execution.model import ModelContext
from swarm.schema import Span
from swarm.telemetry import bytes_per_layer
from swarm.types import LayerSpan, ModelId

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# memory for a third of the layers each: the spans part the model, so no layout serves it
# better than another and the paces measured after a start never move a span
LAYERS = 6
ORDERS = list(itertools.permutations(range(3)))
SERVES_AGAIN_S = 60.0  # from the last start until every node answers a request
STREAM_ENDS_S = 5.0  # a stream whose node was killed ends, with an error, this soon
STREAMED_TOKENS = 200  # asked of the stream cut short: far more than it gets
BROKEN_OFF = "the answer broke off: the connection to .* closed mid-stream"
NOT_YET = (LinkError, StatusFormatError)  # a node not answering yet


@dataclass(frozen=True)
class Lab:
    cluster: Cluster
    spans: dict[str, Span]  # by address: what each node served before the first cut
    caches: dict[str, Path]  # by address: the stores of the nodes that fetch their layers
    stored: dict[str, dict[str, int]]  # by address: part file -> bytes in that store


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("power-cut")
    write_tiny_llama(root / "model", num_hidden_layers=LAYERS)
    runtime = RuntimeConfig(model=str(root / "model"), cache_dir=root / "cache")
    built = asyncio.run(_build(runtime, root))
    try:
        yield built
    finally:
        built.cluster.stop()


async def _build(runtime: RuntimeConfig, root: Path) -> Lab:
    """The lab serving and settled, then the first cut."""
    store = ModelStore.open(runtime.model, runtime.cache_dir, progress=False)
    context = ModelContext.open(runtime, progress=False)
    third = -(-context.num_layers // 3)
    memory = ["--threads", "1", "--layer-memory-bytes", str(third * bytes_per_layer(context))]
    caches = [root / f"fetched-{i}" for i in (1, 2)]
    model = store.manifest.model_id
    fetching = [[*memory, "--model", model, "--cache-dir", str(c)] for c in caches]
    ports = free_ports(3)
    cluster = Cluster(
        [f"127.0.0.1:{p}" for p in ports],
        runtime=runtime,
        state_dir=root / "state",
        flags=[memory, *fetching],
    )
    try:
        for i in range(3):  # the first holds the model file: the others fetch from it
            await asyncio.to_thread(cluster.start, i)
            await _answers(cluster.addresses[i])
        await wait_for_coverage(cluster.addresses[0], 3, 90)
        spans = await until(lambda: _settled(cluster), "the lab settling", 60, ignoring=NOT_YET)
        assert all(end - start < context.num_layers for start, end in spans.values()), spans
        by_address = dict(zip(cluster.addresses[1:], caches, strict=True))
        stored = {a: _stored_parts(c) for a, c in by_address.items()}
        assert all(stored.values()), "the fetching nodes stored nothing"
        built = Lab(cluster, spans, by_address, stored)
        await _cut(cluster, cluster.addresses[0])
    except BaseException:
        cluster.stop()
        raise
    return built


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(map(str, o)) for o in ORDERS])
async def test_a_power_cut_then_every_node_started_again_in_any_order(
    lab: Lab, order: tuple[int, ...]
) -> None:
    """Each node comes back on its own span, fetching nothing, found by the addresses it
    remembered; the swarm answers through every node within SERVES_AGAIN_S of the last
    start. Then the next cut, with a stream in flight through the node started last."""
    cluster = lab.cluster
    try:
        for i in order:
            last_start = time.monotonic()
            await asyncio.to_thread(cluster.start, i, alone=True)
            await _answers(cluster.addresses[i])
        await until(
            lambda: _answering(cluster.addresses),
            "every node answering a request",
            SERVES_AGAIN_S,
            ignoring=(SwarmError,),
        )
        took = time.monotonic() - last_start
        print(f"order {order}: every node answered {took:.1f} s after the last start")
        assert took < SERVES_AGAIN_S
        spans: dict[str, Span | None] = {}

        async def back() -> bool:
            spans.update({a: (await SwarmClient(a).status()).node.span for a in cluster.addresses})
            return spans == lab.spans

        await until(back, lambda: f"the spans {lab.spans} again (last: {spans})", 10)
        for address, cache in lab.caches.items():
            transfer = (await SwarmClient(address).status()).transfer
            assert transfer.bytes_done == 0, (address, transfer)
            assert _stored_parts(cache) == lab.stored[address], "a stored part changed on disk"
        await _cut(cluster, cluster.addresses[order[-1]])
    finally:
        for process in cluster.processes:
            process.kill()
            process.wait(30)


async def _answers(address: str) -> None:
    """Once the node at `address` answers its status."""
    await until(lambda: SwarmClient(address).status(), f"{address} answering", 60, ignoring=NOT_YET)


async def _answering(addresses: list[str]) -> bool:
    """Whether a short greedy completion through each of `addresses` comes back whole."""
    body = {"prompt": "w5 w6 w7", "max_tokens": 4, "temperature": 0}
    for address in addresses:
        streamed = await follow(SwarmClient(address, timeout_s=30).complete(body))
        if not streamed.usage:
            return False
    return True


async def _settled(cluster: Cluster) -> dict[str, Span] | None:
    """Each node's span, once every node serves one, sees the three alive, fetches nothing,
    plans to stay, and keeps its span and the other two addresses in its state folder (what
    a restart reads); None before that."""
    spans: dict[str, Span] = {}
    for address in cluster.addresses:
        status = await SwarmClient(address).status()
        span, port = status.node.span, int(address.rpartition(":")[2])
        alive = {m.address for m in status.members if m.state == "alive" and m.span}
        book = AddressBook(cluster.state_dir / f"members-{port}.json").load()
        kept = read_served_span(
            span_file(cluster.state_dir, port), ModelId(status.model.id), status.model.layers
        )
        if (
            span is None
            or alive != set(cluster.addresses)
            or status.transfer.active
            or status.plan is None
            or not status.plan.decision.startswith("stay")
            or {a for a, _ in book} != set(cluster.addresses) - {address}
            or kept != LayerSpan(*span)
        ):
            return None
        spans[address] = span
    return spans


async def _cut(cluster: Cluster, entry: str) -> None:
    """The power cut: every node killed -9 at once while `entry` streams an answer. The
    client sees the stream break off (its node's connection closed) within STREAM_ENDS_S,
    with an error, and long before the answer's end."""
    body = {
        "prompt": "w5 w6 w7",
        "max_tokens": STREAMED_TOKENS,
        "temperature": 0,
        "logit_bias": {"2": -100},  # never the end of text: the answer is long
    }
    chunks = SwarmClient(entry, timeout_s=60).complete(body)
    received = [await anext(chunks)]  # the answer is streaming
    for process in cluster.processes:
        process.kill()
    cut = time.monotonic()
    with pytest.raises(LinkError, match=BROKEN_OFF) as broken:
        async with asyncio.timeout(STREAM_ENDS_S):
            received += [chunk async for chunk in chunks]
    took = time.monotonic() - cut
    print(f"the cut stream broke off {took * 1000:.0f} ms after the kill: {broken.value}")
    assert len(received) < STREAMED_TOKENS
    for process in cluster.processes:
        process.wait(30)


def _stored_parts(cache: Path) -> dict[str, int]:
    """The parts a fetching node's store holds whole: file name -> bytes."""
    return {p.name: p.stat().st_size for p in cache.glob("*/*.safetensors")}
