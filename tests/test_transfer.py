"""Weights from peers, in one process over real sockets: stores on disk, transfer servers on
127.0.0.1:0, and the fetcher between them. Parts here span several chunks."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from harness import transfer_sender
from harness.disks import fill_to, small_disk
from harness.factories import write_tiny_llama
from harness.polling import until
from swarm.config import TransferConfig
from swarm.errors import CacheWriteError, ModelNotFoundError, TransferError
from swarm.runtime.checkpoint.convert import HASH_SUFFIX
from swarm.runtime.checkpoint.layout import EMBED, layer_part
from swarm.runtime.checkpoint.manifest import CHUNK_BYTES, DIGEST_SUFFIX, PartDigest
from swarm.runtime.checkpoint.store import ModelStore
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.index import fetch_index
from swarm.transfer.partial import Partial
from swarm.transfer.protocol import TRANSFER_PATH, Ask, Request, TransferCodec
from swarm.transfer.server import TransferServer
from swarm.types import NodeId

KEY = transfer_sender.KEY
# wide enough that a layer is a few chunks
WIDE = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 3}


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wide-llama")
    write_tiny_llama(folder, **WIDE)
    return folder


@asynccontextmanager
async def serving(
    store: ModelStore, name: str, key: bytes = KEY, rate: float = 0
) -> AsyncIterator[tuple[str, TransferServer]]:
    runner, address, server = await transfer_sender.start(store, name, key, rate)
    try:
        yield address, server
    finally:
        await runner.cleanup()


def _client(name: str, key: bytes = KEY) -> PeerClient:
    return PeerClient(TransferCodec(key, NodeId(name)), 10.0)


@asynccontextmanager
async def peer_store(
    address: str, ref: str, cache: Path, name: str
) -> AsyncIterator[tuple[ModelStore, Fetcher]]:
    """A node without the file: the index from `address`, then a fetcher for its parts."""
    client = _client(name)
    try:
        await fetch_index(client, [address], ref, cache)
        store = ModelStore.open(ref, cache)
        yield store, Fetcher(store, client, TransferConfig(parallel_per_peer=2))
    finally:
        await client.close()


async def test_parts_come_verified_from_two_peers_and_a_corrupt_one_is_avoided(
    wide_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    model_id = holder.manifest.model_id
    parts = [EMBED, layer_part(0), layer_part(1)]
    async with serving(holder, "a") as (a, _):
        async with peer_store(a, model_id[:12], tmp_path / "b", "b") as (second, fetcher):
            assert not second.has_checkpoint
            await fetcher.ensure(parts, [a])
        assert second.missing(parts) == []
        for part in parts:
            assert second.load_part(part).keys() == holder.load_part(part).keys()
        # the second holder's copy of layer 1 goes bad on disk, after its digest was taken
        file = second.folder / second.manifest.parts[layer_part(1)].file
        data = bytearray(file.read_bytes())
        assert len(data) > 2 * CHUNK_BYTES
        data[CHUNK_BYTES + 7] ^= 0xFF
        file.write_bytes(bytes(data))
        async with serving(second, "b") as (b, b_server):
            async with peer_store(b, model_id, tmp_path / "c", "c") as (third, fetcher3):
                await fetcher3.ensure(parts, [b, a])
            assert third.missing(parts) == []
            assert (third.folder / third.manifest.parts[layer_part(1)].file).read_bytes() == (
                holder.folder / holder.manifest.parts[layer_part(1)].file
            ).read_bytes()
            report = fetcher3.report()
            assert report.bad_peers == (b,)
            assert report.parts_done == 3 and not report.active
            assert b_server.sent_bytes > 0  # it did send; its bad chunk was caught


async def test_the_bytes_each_layer_lacks_and_the_rate_they_would_come_at(
    wide_folder: Path, tmp_path: Path
) -> None:
    """What a move's fetch would cost, as the rebalancer weighs it (decide.FetchCost)."""
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    async with (
        serving(holder, "a") as (a, _),
        peer_store(a, holder.manifest.model_id, tmp_path / "b", "b") as (store, fetcher),
    ):
        sizes = tuple(store.part_bytes(layer_part(i)) for i in range(3))
        assert all(sizes) and fetcher.missing_layer_bytes(3) == sizes
        # before any fetch: the configured per-link rate
        assert fetcher.rate_bytes_per_s() == TransferConfig().rate_bytes_per_s
        await fetcher.ensure([layer_part(0)], [a])
        assert fetcher.missing_layer_bytes(3) == (0, *sizes[1:])
        assert fetcher.rate_bytes_per_s() > 0
    # a node that holds the file lacks nothing (its client is never used)
    with_file = Fetcher(holder, _client("a"), TransferConfig())
    assert with_file.missing_layer_bytes(3) == (0, 0, 0)


async def test_an_interrupted_fetch_resumes_from_the_chunks_it_kept(
    wide_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    model_id = holder.manifest.model_id
    async with (
        serving(holder, "a") as (a, server),
        peer_store(a, model_id, tmp_path / "b", "b") as (store, fetcher),
    ):
        await _resume(holder, store, fetcher, server, a)


async def _resume(
    holder: ModelStore, store: ModelStore, fetcher: Fetcher, server: TransferServer, a: str
) -> None:
    part = layer_part(2)
    digest = holder.digest(part)
    assert digest is not None and len(digest.chunks) >= 3
    # two chunks arrived before the node stopped
    kept = Partial(store.folder / f".{store.manifest.parts[part].file}", digest)
    kept.open()
    source = (holder.folder / holder.manifest.parts[part].file).read_bytes()
    for i in (0, 1):
        start, end = digest.chunk_range(i)
        kept.write(i, source[start:end])
    sent = server.sent_bytes
    await fetcher.ensure([part], [a])
    assert server.sent_bytes - sent == digest.size - 2 * CHUNK_BYTES
    assert store.load_part(part).keys() == holder.load_part(part).keys()


def test_peers_asking_one_part_at_once_get_its_digest(wide_folder: Path, tmp_path: Path) -> None:
    """Two nodes fetching from one holder ask for the same part's digest together: the
    holder's threads each compute and keep it, and none of them fails (a temporary file
    shared by the threads was renamed by one under the other)."""
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    part = layer_part(1)
    path = holder.folder / holder.manifest.parts[part].file
    side = path.with_name(path.name + DIGEST_SUFFIX)
    threads = 4
    start = threading.Barrier(threads)

    def ask(_: int) -> PartDigest | None:
        start.wait()
        return holder.digest(part)

    for _ in range(20):  # each round computes it afresh
        side.unlink(missing_ok=True)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            digests = list(pool.map(ask, range(threads)))
        assert None not in digests
        assert len({d.sha256 for d in digests if d is not None}) == 1
    assert not [p.name for p in holder.folder.rglob(".*tmp-*")], "a temporary file was left"


async def test_a_peer_refuses_another_model_and_another_swarm(
    wide_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    async with serving(holder, "a") as (a, server):
        # every peer asked serves another model: no such model (a wrong start); a peer of
        # another swarm cannot be asked at all (a failure of the network's)
        for client, ref, error, why in [
            (_client("b"), "0123456789abcdef", ModelNotFoundError, "serves"),
            (_client("b", b"x" * 32), holder.manifest.model_id, TransferError, "400"),
        ]:
            try:
                with pytest.raises(error, match=why):
                    await fetch_index(client, [a], ref, tmp_path / "b")
            finally:
                await client.close()
        assert server.refused == 1
        assert not list((tmp_path / "b").glob("peer-*"))


async def test_a_request_sealed_for_one_peer_is_refused_by_another_and_later(
    wide_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    ask = Request(Ask.INDEX, holder.manifest.model_id)
    async with (
        serving(holder, "a") as (a, server_a),
        serving(holder, "b") as (b, server_b),
        aiohttp.ClientSession() as http,
    ):

        async def post(address: str, body: bytes) -> tuple[int, str]:
            async with http.post(f"http://{address}{TRANSFER_PATH}", data=body) as reply:
                return reply.status, "" if reply.status == 200 else await reply.text()

        _, sealed = TransferCodec(KEY, NodeId("c")).seal_request(ask, NodeId("a"))
        assert await post(a, sealed) == (200, "")
        status, why = await post(b, sealed)  # captured on its way to a, replayed to b
        assert status == 421 and "not a" in why
        status, why = await post(a, sealed)
        assert status == 400 and "replay" in why
        month_ago = lambda: time.time_ns() - 30 * 86400 * 10**9  # noqa: E731
        _, old = TransferCodec(KEY, NodeId("c"), clock_ns=month_ago).seal_request(ask, NodeId("a"))
        status, why = await post(a, old)
        assert status == 400 and "outside the window" in why
        assert (server_a.refused, server_b.refused, server_b.sent_bytes) == (2, 1, 0)


async def test_no_peer_holding_a_part_is_a_typed_error(wide_folder: Path, tmp_path: Path) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    async with serving(holder, "a") as (a, _):
        model_id = holder.manifest.model_id
        async with (
            peer_store(a, model_id, tmp_path / "b", "b") as (store, _),
            serving(store, "b") as (b, _),
            peer_store(b, model_id, tmp_path / "c", "c") as (_, fetcher),
        ):
            with pytest.raises(TransferError, match="no peer holds"):
                await asyncio.wait_for(fetcher.ensure([layer_part(0)], [b]), 10)


@pytest.mark.slow  # a sender process of its own
async def test_a_sender_killed_mid_transfer_leaves_the_rest_to_another_peer(
    wide_folder: Path, tmp_path: Path
) -> None:
    rate = CHUNK_BYTES  # a chunk a second from each peer: the transfer takes a few seconds
    args = [str(wide_folder), str(tmp_path / "s"), str(rate)]
    sender = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harness.transfer_sender", *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert sender.stdout is not None
        line = await asyncio.wait_for(sender.stdout.readline(), 120)
        killed = f"127.0.0.1:{line.split()[1].decode()}"
        holder = ModelStore.open(str(wide_folder), tmp_path / "a")
        part = layer_part(1)
        async with (
            serving(holder, "a", rate=rate) as (a, _),
            peer_store(a, holder.manifest.model_id, tmp_path / "b", "b") as (store, fetcher),
        ):
            fetch = asyncio.create_task(fetcher.ensure([part], [killed, a]))
            await until(
                lambda: fetcher.report().bytes_done >= CHUNK_BYTES, "the first chunk landing", 60
            )
            assert killed in fetcher.report().sources
            sender.send_signal(signal.SIGKILL)
            await asyncio.wait_for(fetch, 60)
            assert store.missing([part]) == []
            assert store.load_part(part).keys() == holder.load_part(part).keys()
            assert fetcher.report().bad_peers == ()  # a dead peer is not a corrupt one
    finally:
        if sender.returncode is None:
            sender.kill()
        await sender.wait()


async def test_copies_gone_bad_the_same_way_never_outvote_the_file(
    wide_folder: Path, tmp_path: Path
) -> None:
    """Two peers hold the same wrong copy of a layer, with digests that match it; the one
    peer with the model file is outvoted two to one, and still its digest is the one used."""
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    model_id = holder.manifest.model_id
    part = layer_part(1)
    async with serving(holder, "a") as (a, _):
        copies = []
        for name in ("b", "c"):
            async with peer_store(a, model_id, tmp_path / name, name) as (copy, fetcher):
                await fetcher.ensure([part], [a])
            _rewrite_consistently(copy, part)
            copies.append(copy)
        async with (
            serving(copies[0], "b") as (b, _),
            serving(copies[1], "c") as (c, _),
            peer_store(a, model_id, tmp_path / "d", "d") as (fourth, fetcher),
        ):
            await fetcher.ensure([part], [b, c, a])
            assert sorted(fetcher.report().bad_peers) == sorted([b, c])
        record = fourth.manifest.parts[part]
        assert (fourth.folder / record.file).read_bytes() == (
            holder.folder / record.file
        ).read_bytes()


def _rewrite_consistently(store: ModelStore, part: str) -> None:
    """Flip a byte of a stored part and rewrite its digest and hash to match the new bytes:
    a copy that is wrong but says so about itself."""
    path = store.folder / store.manifest.parts[part].file
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))
    digest = PartDigest.of(bytes(data))
    path.with_name(path.name + DIGEST_SUFFIX).write_text(json.dumps(digest.to_json()))
    path.with_name(path.name + HASH_SUFFIX).write_text(digest.sha256)


async def test_a_full_disk_is_one_clear_error_and_keeps_nothing_half_written(
    wide_folder: Path, tmp_path: Path
) -> None:
    holder = ModelStore.open(str(wide_folder), tmp_path / "a")
    part = layer_part(0)
    with small_disk(tmp_path / "small", 16) as disk:
        async with (
            serving(holder, "a") as (a, _),
            peer_store(a, holder.manifest.model_id, disk / "b", "b") as (store, fetcher),
        ):
            filler = fill_to(disk, store.part_bytes(part) // 2)  # room for half of the part
            with pytest.raises(CacheWriteError, match="No space left on device") as refused:
                await fetcher.ensure([part], [a])
            assert ".partial" in str(refused.value) and str(store.folder) in str(refused.value)
            assert [p.name for p in store.folder.iterdir() if ".partial" in p.name] == []
            assert store.missing([part]) == [part]
            filler.unlink()  # room again: the same fetcher fetches it
            await fetcher.ensure([part], [a])
            assert store.load_part(part).keys() == holder.load_part(part).keys()
