"""Round trips to peers, measured over the node-to-node links themselves. Every
`rtt_probe_interval_s` a probe padded to the size of one decode step's activation frame goes
to the `rtt_probes_per_interval` peers measured longest ago (never-measured ones first), each
answering over its own link. Sampling keeps the traffic linear in the swarm's size (probing
every peer every interval is quadratic across the swarm); sizing the probe as a step makes a
peer behind a slow link look as slow as it is for the frames routing weighs, where an empty
ping would only measure latency. Kept as an exponential moving average per peer."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import torch

from swarm.config import NetConfig
from swarm.errors import LinkError
from swarm.net.links import Links
from swarm.types import NodeId
from swarm.wire import LinkProbe, Peer, ProbeReply

log = logging.getLogger(__name__)

_SMOOTHING = 0.3  # weight of a new sample in the moving average

PeerList = Callable[[], Iterable[tuple[NodeId, str]]]  # (id, address) of peers to measure


class RoundTrips:
    def __init__(self, me: Peer, links: Links, config: NetConfig, step_bytes: int) -> None:
        """`step_bytes`: the activations one decode step carries between hops."""
        self._me = me
        self._links = links
        self._config = config
        self._seq = itertools.count()
        self._waiting: dict[tuple[NodeId, int], asyncio.Future[float]] = {}
        self._ms: dict[NodeId, float] = {}
        self._measured_at: dict[NodeId, float] = {}  # monotonic time of the last attempt
        self._answers: set[asyncio.Task[None]] = set()
        # random float32 values: lz4 cannot shrink them, so the frame is as big as a step's
        self._padding = torch.randn(1, 1, max(1, step_bytes // 4))
        self._ping = torch.zeros(1, 1, 1)  # a liveness probe carries next to nothing

    def snapshot(self) -> Mapping[NodeId, float]:
        """Smoothed round trips in milliseconds, by peer; peers never measured are absent."""
        return MappingProxyType(dict(self._ms))

    async def run(self, peers: PeerList) -> None:
        while True:
            for node_id, address in self.due(peers()):
                await self.measure(node_id, address)
            await asyncio.sleep(self._config.rtt_probe_interval_s)

    def due(self, peers: Iterable[tuple[NodeId, str]]) -> list[tuple[NodeId, str]]:
        """The peers to probe this interval: those measured longest ago, never-measured first;
        peers no longer listed are forgotten."""
        listed = dict(peers)
        for gone in set(self._measured_at) - set(listed):
            del self._measured_at[gone]
            self._ms.pop(gone, None)
        stalest = sorted(listed, key=lambda node: self._measured_at.get(node, -math.inf))
        return [(node, listed[node]) for node in stalest[: self._config.rtt_probes_per_interval]]

    async def measure(self, node_id: NodeId, address: str) -> float | None:
        """One padded probe; its round trip in ms (also folded into the average), None when
        lost."""
        self._measured_at[node_id] = time.monotonic()
        ms = await self._probe(node_id, address, self._padding, self._config.send_timeout_s)
        if ms is None:
            return None
        old = self._ms.get(node_id)
        self._ms[node_id] = ms if old is None else old + _SMOOTHING * (ms - old)
        return ms

    async def answers(self, node_id: NodeId, address: str, timeout_s: float) -> bool:
        """Whether the peer answers a small probe within `timeout_s`. Its event loop answers
        at once, however busy its compute thread is, so silence means frozen or gone."""
        return await self._probe(node_id, address, self._ping, timeout_s) is not None

    async def _probe(
        self, node_id: NodeId, address: str, padding: torch.Tensor, timeout_s: float
    ) -> float | None:
        seq = next(self._seq)
        reply: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[(node_id, seq)] = reply
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                await self._links.send(address, LinkProbe(seq, self._me, padding))
                arrived = await reply
        except (LinkError, TimeoutError) as e:
            log.debug("probe of %s lost: %s", node_id, e or type(e).__name__)
            return None
        finally:
            self._waiting.pop((node_id, seq), None)
        return (arrived - started) * 1000

    def resolve(self, sender: NodeId, reply: ProbeReply) -> None:
        """A ProbeReply arrived from `sender` (authenticated by its frame)."""
        future = self._waiting.pop((sender, reply.seq), None)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    def answer(self, probe: LinkProbe) -> None:
        """Reply to a peer's probe, in the background: the send may wait on a slow link."""
        task = asyncio.create_task(self._answer(probe))
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _answer(self, probe: LinkProbe) -> None:
        try:
            await self._links.send(probe.reply_to.address, ProbeReply(probe.seq))
        except LinkError as e:
            log.debug("cannot answer a probe from %s: %s", probe.reply_to.node_id, e)
