"""The receiving side: asks peers which of them hold a part and what it hashes to, then pulls
its chunks from all of them at once (each peer a few requests in flight: the back-pressure is
that a peer is asked for the next chunk only when the last one arrived), checks each chunk
against the digest, writes it into a partial file at its offset and records it, so a transfer
cut off (a peer killed, this node restarted) resumes where it stopped. A peer whose chunk
fails its digest is reported and never asked again; its chunk is fetched from another."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence

import aiohttp

from swarm.config import TransferConfig
from swarm.errors import CacheWriteError, CorruptModelError, FrameError, TransferError
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.checkpoint.manifest import CHUNK_BYTES, PartDigest
from swarm.runtime.checkpoint.store import ModelStore
from swarm.schema import TransferReport
from swarm.transfer.partial import Partial
from swarm.transfer.progress import Progress
from swarm.transfer.protocol import (
    MAX_NODE_ID_BYTES,
    TRANSFER_PATH,
    Ask,
    Reply,
    Request,
    TransferCodec,
)
from swarm.types import NodeId
from swarm.wire import NODE_HEADER

log = logging.getLogger(__name__)

_UNMEASURED_RATE = 64 * 1024 * 1024  # bytes/s assumed before a fetch measured the links
_MAX_ERRORS = 3  # failed requests (not bad data) after which a peer is left out of a part


class PeerClient:
    """One authenticated request at a time to a peer's transfer endpoint."""

    def __init__(self, codec: TransferCodec, timeout_s: float) -> None:
        self._codec = codec
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._ids: dict[str, NodeId] = {}  # peer address -> the node id its requests name

    async def ask(self, address: str, request: Request, limit: int = CHUNK_BYTES * 2) -> Reply:
        """The peer's reply; TransferError when it cannot be had (refused, unreachable, or
        not authentic)."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        try:
            # the first request to a peer learns its id (421), the second is addressed to it
            for _ in range(2):
                reply = await self._ask_once(self._http, address, request, limit)
                if reply is not None:
                    return reply
            raise TransferError(f"{address} keeps saying requests are not addressed to it")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise TransferError(f"{address}: {e or type(e).__name__}") from None
        except FrameError as e:
            raise TransferError(f"{address}: {e}") from None

    async def _ask_once(
        self, http: aiohttp.ClientSession, address: str, request: Request, limit: int
    ) -> Reply | None:
        """The reply, or None when the peer answered with its id (remembered for the next)."""
        counter, body = self._codec.seal_request(request, self._ids.get(address))
        async with http.post(f"http://{address}{TRANSFER_PATH}", data=body) as r:
            if r.status == 421:
                said = r.headers.get(NODE_HEADER, "")
                if not 0 < len(said.encode()) <= MAX_NODE_ID_BYTES:
                    raise TransferError(f"{address} did not say its node id")
                self._ids[address] = NodeId(said)
                return None
            if r.status != 200:
                raise TransferError(f"{address} refused: {r.status} {await r.text()}")
            if (r.content_length or 0) > limit:
                raise TransferError(f"{address} sent a reply over {limit} bytes")
            data = await _read_all(r.content, limit, address)
        return self._codec.open_reply(data, counter)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


async def _read_all(content: aiohttp.StreamReader, limit: int, address: str) -> bytes:
    parts, size = [], 0
    # read() may return less than asked (one TCP segment): loop until the end
    while part := await content.read(limit + 1 - size):
        size += len(part)
        if size > limit:
            raise TransferError(f"{address} sent a reply over {limit} bytes")
        parts.append(part)
    return b"".join(parts)


class Fetcher:
    def __init__(self, store: ModelStore, client: PeerClient, config: TransferConfig) -> None:
        self._store = store
        self._client = client
        self._config = config
        self.progress = Progress()
        self.bad: dict[str, str] = {}  # peer address -> what it sent wrong
        self._lock = asyncio.Lock()  # one fetch at a time: a move and a probe may both ask

    def missing_layer_bytes(self, num_layers: int) -> tuple[int, ...]:
        """Per layer of the model, the bytes of its part this store lacks (0 where stored)."""
        missing = set(self._store.missing([layer_part(i) for i in range(num_layers)]))
        return tuple(
            self._store.part_bytes(layer_part(i)) if layer_part(i) in missing else 0
            for i in range(num_layers)
        )

    def rate_bytes_per_s(self) -> float:
        """The rate fetches reached so far (the configured per-link limit before any was
        measured): how long a fetch would take."""
        measured = self.progress.measured_bytes_per_s()
        return float(measured or self._config.rate_bytes_per_s or _UNMEASURED_RATE)

    def report(self, sent_bytes: int = 0) -> TransferReport:
        return self.progress.report(tuple(self.bad), sent_bytes)

    async def ensure(self, parts: Sequence[str], peers: Sequence[str]) -> None:
        """Fetch those of `parts` this store lacks from `peers`; TransferError when some
        part cannot be had from any of them."""
        async with self._lock:
            missing = self._store.missing(list(parts))
            if not missing:
                return
            self.progress.begin(missing, sum(self._store.part_bytes(p) for p in missing))
            try:
                for part in missing:
                    await self.fetch_part(part, [p for p in dict.fromkeys(peers) if p])
            finally:
                self.progress.end()

    async def fetch_part(self, part: str, peers: list[str]) -> None:
        """One missing part from `peers` (`ensure` holds the lock and the progress around it).
        The extension point for other sources: a subclass may try them when peers fail."""
        digest, holders = await self._holders(part, peers)
        self.progress.part(part, digest.size, self._store.part_bytes(part), holders)
        partial = Partial(self._store.folder / f".{self._store.manifest.parts[part].file}", digest)
        try:
            await self._assemble(part, digest, holders, partial)
        except OSError as e:
            # a full or failing disk: nothing half-written is kept (the chunks kept for a
            # later try would only hold the space another write needs)
            with contextlib.suppress(OSError):
                await asyncio.to_thread(partial.discard)
            raise CacheWriteError(f"cannot write {partial.path}: {e.strerror or e}") from None
        await asyncio.to_thread(self._store.adopt, part, partial.path, digest)
        partial.forget()
        self.progress.finished()
        log.info("fetched %s (%d bytes) from %s", part, digest.size, ", ".join(holders))

    async def _assemble(
        self, part: str, digest: PartDigest, holders: list[str], partial: Partial
    ) -> None:
        """The part's chunks into `partial`, checked whole; OSError where the disk fails."""
        done = await asyncio.to_thread(partial.open)
        self.progress.advance(sum(_size(digest, i) for i in done))
        errors: Counter[str] = Counter()
        while len(done) < len(digest.chunks):
            usable = [h for h in holders if h not in self.bad and errors[h] < _MAX_ERRORS]
            if not usable:
                raise TransferError(
                    f"{part}: no peer left to fetch it from "
                    f"({len(done)}/{len(digest.chunks)} chunks kept for a later try)"
                )
            todo: asyncio.Queue[int] = asyncio.Queue()
            for i in range(len(digest.chunks)):
                if i not in done:
                    todo.put_nowait(i)
            workers = [
                asyncio.ensure_future(self._worker(part, address, todo, partial, done, errors))
                for address in usable
                for _ in range(self._config.parallel_per_peer)
            ]
            try:
                await asyncio.gather(*workers)
            finally:  # one worker's error ends the others (none writes into a discarded file)
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        if not await asyncio.to_thread(partial.complete):
            await asyncio.to_thread(partial.discard)
            raise TransferError(f"{part}: the assembled file does not match its digest")

    async def _worker(
        self,
        part: str,
        address: str,
        todo: asyncio.Queue[int],
        partial: Partial,
        done: set[int],
        errors: Counter[str],
    ) -> None:
        model = self._store.manifest.model_id
        while address not in self.bad and errors[address] < _MAX_ERRORS:
            try:
                index = todo.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                reply = await self._client.ask(address, Request(Ask.CHUNK, model, part, index))
                if reply.error is not None:
                    raise TransferError(f"{address}: {reply.error}")
            except TransferError as e:
                errors[address] += 1
                log.info("chunk %d of %s from %s failed: %s", index, part, address, e)
                todo.put_nowait(index)
                continue
            if not partial.fits(index, reply.payload):
                self.bad[address] = f"chunk {index} of {part} failed its digest"
                log.warning(
                    "peer %s sent chunk %d of %s that fails its digest; "
                    "fetching it elsewhere and avoiding that peer",
                    address,
                    index,
                    part,
                )
                todo.put_nowait(index)
                return
            await asyncio.to_thread(partial.write, index, reply.payload)
            done.add(index)
            self.progress.advance(len(reply.payload))

    async def _holders(self, part: str, peers: list[str]) -> tuple[PartDigest, list[str]]:
        """The digest of `part` that the peers holding the model file give (most of them,
        should they differ), else the one most peers agree on; and the peers that hold it.
        A copy's digest is only what a peer says it fetched, so copies gone bad the same way
        on several peers never outvote the file."""
        model = self._store.manifest.model_id
        asked = [p for p in peers if p not in self.bad]
        replies = await asyncio.gather(
            *(self._client.ask(p, Request(Ask.DIGEST, model, part)) for p in asked),
            return_exceptions=True,
        )
        digests: dict[str, PartDigest] = {}
        from_file: set[str] = set()
        for address, reply in zip(asked, replies, strict=True):
            if isinstance(reply, BaseException):
                if not isinstance(reply, TransferError):
                    raise reply
                log.debug("no digest of %s from %s: %s", part, address, reply)
            elif reply.error is None:
                try:
                    digests[address] = PartDigest.from_json(reply.fields.get("digest"))
                    if reply.fields.get("from_file") is True:
                        from_file.add(address)
                except CorruptModelError as e:
                    self.bad[address] = str(e)
        if not digests:
            raise TransferError(
                f"no peer holds {part} (asked {', '.join(asked) or 'none'}); "
                "is a node with the model file running?"
            )
        voters = [d for a, d in digests.items() if a in from_file] or list(digests.values())
        (agreed, _), *_ = Counter(voters).most_common(1)
        for address, digest in digests.items():
            if digest != agreed:
                self.bad[address] = (
                    f"its digest of {part} differs from the model file's"
                    if from_file
                    else f"its digest of {part} differs from other peers'"
                )
        return agreed, [a for a, d in digests.items() if d == agreed]


def _size(digest: PartDigest, index: int) -> int:
    start, end = digest.chunk_range(index)
    return end - start
