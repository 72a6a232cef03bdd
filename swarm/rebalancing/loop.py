"""The rebalancer's loop: once the view is quiet it gathers a snapshot (the view from
membership, this node's span from its shards, what fetching would cost), calls
`decide`, and acts: fetches and loads a span, waits out the handoff, announces. Every rule is
in `swarm/rebalancing/decide.py`; housekeeping runs after each round."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarm import placement
from swarm.config import Config, PlacementConfig
from swarm.errors import CacheWriteError, CorruptModelError, ModelError, TransferError
from swarm.membership.served_span import span_file, write_served_span
from swarm.membership.subsystem import Membership
from swarm.rebalancing import decide as core
from swarm.rebalancing.housekeeping import Housekeeping, RecordRefresher
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.kept_prompts import folder_of, read_kept
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import Shard
from swarm.runtime.gpu.device import accelerator
from swarm.runtime.weights import heap
from swarm.telemetry import SpeedMeter
from swarm.transfer.subsystem import Transfer
from swarm.transfer.supply import peer_addresses

log = logging.getLogger(__name__)

_HANDOFF_POLL_S = 0.2  # seconds between looks at who announces the layers being given up


@dataclass(frozen=True)
class RebalancerParts:
    """What the rebalancer gathers its inputs from and acts through."""

    context: ModelContext  # the model: its layers, and how a span of them loads
    compute: ComputeThread  # loads shards and touches their KV caches, off the event loop
    membership: Membership  # the view it plans on, and where it announces its span
    serving: Serving  # the shards this node serves, current and retiring
    speed: SpeedMeter  # this node's measured pace, which housekeeping republishes
    fetcher: Transfer | None = None  # None: every part is in this node's store or its file
    # held from loading a shard to serving it (a move, a reload): one at a time, so that a
    # move never carries over the blocks a reload is replacing
    swapping: asyncio.Lock = field(default_factory=asyncio.Lock)


class Rebalancer:
    def __init__(
        self,
        config: Config,
        parts: RebalancerParts,
        housekeeping: Housekeeping,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._placement: PlacementConfig = config.placement
        self._runtime = config.runtime
        # where the prompt blocks this node kept wait for its restart
        self._prompt_folder = folder_of(config.node.state_dir, parts.membership.local.node_id)
        self._span_file = span_file(config.node.state_dir, config.node.port)
        self._settle_s = config.membership.settle_s  # the view is quiet this long before a round
        self._parts = parts
        self.housekeeping = housekeeping
        self._clock = clock
        self.state = core.RebalanceState()
        self.last: core.Decision | None = None  # the last decision, for /status
        # SpanError: a pinned span outside the model stops the node from starting
        core.pinned_span(parts.context.num_layers, config.placement.span)

    @classmethod
    def create(cls, config: Config, parts: RebalancerParts) -> Rebalancer:
        gpu = accelerator(parts.context.device)
        refresher = RecordRefresher(parts.speed, parts.serving, parts.compute, gpu)
        grace_s = 4 * config.membership.settle_s  # several gossip rounds for entries to see it
        housekeeping = Housekeeping(
            parts.context, config.runtime, parts.membership, refresher, grace_s
        )
        return cls(config, parts, housekeeping)

    @property
    def plan(self) -> placement.Plan | None:
        return self.state.plan

    async def run(self) -> None:
        membership = self._parts.membership
        while True:
            await membership.quiet(self._settle_s)
            await self.rebalance()
            await self.housekeeping.once()
            await membership.changed_within(self._settle_s * 4)

    def _inputs(self) -> core.Inputs:
        parts = self._parts
        fetcher, num_layers = parts.fetcher, parts.context.num_layers
        fetch = (
            core.FetchCost()
            if fetcher is None
            else core.FetchCost(fetcher.missing_layer_bytes(num_layers), fetcher.rate_bytes_per_s())
        )
        return core.Inputs(
            me=parts.membership.local,
            members=tuple(parts.membership.routable()),
            serving=parts.serving.span,
            num_layers=num_layers,
            config=self._placement,
            now=self._clock(),
            fetch=fetch,
            kept_positions=sum(len(shard.kv.prefixes) for shard in parts.serving.all())
            * self._runtime.prefill_chunk_tokens,
        )

    def _decide(self) -> core.Decision:
        outcome = core.decide(self.state, self._inputs())
        self.state, self.last = outcome.state, outcome.decision
        return outcome.decision

    async def rebalance(self) -> None:
        """One round: plan, and carry out the move it decides, make-before-break."""
        move = self._decide()
        if not isinstance(move, core.Load):
            log.debug("plan: %s", core.describe(move))
            return
        log.info(
            "plan: this node serves layers %s (was %s); loading them (%s, bottleneck %.1f ->"
            " %.1f tokens/s, threshold %.0f%%, paces %s ms/layer)",
            move.target,
            move.current,
            move.reason.value,
            move.bottleneck,
            move.plan.bottleneck,
            100 * move.threshold,
            ", ".join(
                f"{r.node_id[:8]} {r.capacity.ms_per_layer_decode:.3f}" for r in move.records
            ),
        )
        if not await self._fetched(move):
            return
        async with self._parts.swapping:
            await self._load_and_serve(move)

    async def _load_and_serve(self, move: core.Load) -> None:
        """Load the move's span (sharing the layers the current shard holds) and serve it
        once the hand-off allows."""
        parts = self._parts
        try:
            shard = await parts.compute.run(
                Shard.load, parts.context, move.target, self._runtime, parts.serving.shard
            )
        # a GGUF's layers are written to the cache as they load; a stored layer changed on
        # disk is discarded at load, and fetched again at the next round
        except (CacheWriteError, CorruptModelError) as e:
            self._cannot_load(move, e)
            return
        if self._runtime.prompt_cache:  # what it kept of these layers before a restart
            await parts.compute.run(read_kept, parts.context, shard, self._prompt_folder)
        self.state = core.loaded(self.state, move, self._clock())
        if not await self._hand_off():
            del shard  # the loaded layers' last reference: the current shard serves on
            await parts.compute.run(heap.trim)  # else the heap keeps some of their bytes
            return
        await parts.compute.run(parts.serving.move_to, shard, self._clock())
        self.state = core.announced(self.state, self._clock())
        membership = parts.membership
        membership.publish(dataclasses.replace(membership.local, span=move.target))
        log.info("serving layers %s", move.target)
        model_id = membership.local.model_id
        await asyncio.to_thread(write_served_span, self._span_file, model_id, move.target)

    async def _hand_off(self) -> bool:
        """Keep announcing the old span until `decide` says the new one may be announced
        (True), or that the move is off (False)."""
        done = await self._takers_announced()
        if isinstance(done, core.CallOff):
            log.warning(
                "not moving to layers %s: %s, which the plan gave layers of this node to,"
                " leaves; serving %s on",
                done.target,
                ", ".join(node[:8] for node in done.leaving),
                self._parts.serving.span,
            )
            return False
        if done.abandoned:
            log.warning(
                "giving up layers %s that no member the plan keeps on them announced within %.0f s",
                ", ".join(str(s) for s in done.abandoned),
                done.waited_s,
            )
        if done.settle:
            # the successors' records reached this node; give them a few gossip rounds
            # to reach every entry before this node's record stops listing the layers
            await asyncio.sleep(self._settle_s)
        return True

    async def _takers_announced(self) -> core.Announce | core.CallOff:
        while True:
            step = self._decide()
            if isinstance(step, (core.Announce, core.CallOff)):
                return step
            if isinstance(step, core.AwaitTakers) and step.newly_patient:
                log.info(
                    "still waiting for the members taking over layers %s to load them",
                    ", ".join(str(s) for s in step.waiting),
                )
            await self._parts.membership.changed_within(_HANDOFF_POLL_S, fresh=True)

    async def _fetched(self, move: core.Load) -> bool:
        """Bring the layers of the move's span this node lacks from the peers (while its old
        span keeps serving); False when they cannot be had now (a later re-plan tries again)."""
        fetcher = self._parts.fetcher
        if fetcher is None:
            return True
        me = self._parts.membership.local.node_id
        peers = peer_addresses(move.records, me, move.target)
        try:
            await fetcher.ensure([layer_part(i) for i in move.target], peers)
        except (TransferError, CacheWriteError) as e:
            self._cannot_load(move, e)
            return False
        return True

    def _cannot_load(self, move: core.Load, error: ModelError) -> None:
        """One line for a move that cannot be carried out now (no peer has the layers, or
        the disk is full or failing): the node serves on what it serves, and a later
        re-plan tries again."""
        serving = self._parts.serving.span
        log.warning(
            "cannot load layers %s yet: %s; %s",
            move.target,
            error,
            "serving nothing meanwhile" if serving is None else f"serving {serving} on",
        )
