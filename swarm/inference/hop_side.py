"""The hop side of a node: the frames that arrive on its links (dispatch), the hop server that
runs this node's layers for other entries, decode batching, the shards it serves, the
rebalancer that moves its span, and the reloader that reloads it when an entry found it
computing wrong bits."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from swarm import placement
from swarm.config import Config
from swarm.inference.batching import DecodeBatcher, PrefillBatcher
from swarm.inference.dispatch import serve_inbox
from swarm.inference.hop import HopServer
from swarm.inference.hop_core import HopCore
from swarm.inference.hop_ledger import HopLedger
from swarm.inference.leaving import LeavingGate
from swarm.inference.reload import Reloader
from swarm.inference.thread_steps import OwnEntry, ThreadSteps
from swarm.inference.waiters import StepWaiters
from swarm.measures import summed
from swarm.membership.subsystem import Membership
from swarm.net.endpoint import Inbox
from swarm.net.fast_links import FastListener
from swarm.net.links import LINK_PATH, Links
from swarm.polling import until
from swarm.rebalancing.decide import describe
from swarm.rebalancing.loop import Rebalancer, RebalancerParts
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.kept_prompts import folder_of, write_kept
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.serving import Serving
from swarm.schema import HopLoad, PlanReport, PromptCacheLoad
from swarm.telemetry import SpeedMeter
from swarm.transfer.subsystem import Transfer
from swarm.types import NodeId
from swarm.wire import FrameCodec, Message, StepMessage

__all__ = ["LINK_PATH", "HopReport", "HopSide"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HopReport:
    layers: int  # of the model
    plan: PlanReport | None
    load: HopLoad  # this node's shards and its decode batching
    prompt_cache: PromptCacheLoad  # the blocks its shards keep


@dataclass(frozen=True)
class HopParts:
    """What the hop side shares with the rest of the node, built before it."""

    context: ModelContext
    compute: ComputeThread
    links: Links
    speed: SpeedMeter
    membership: Membership
    waiters: StepWaiters  # the entry side's steps in flight, resolved by dispatch
    transfer: Transfer  # brings the parts of a new span from peers, when this node lacks them
    # the fast links' listening socket (swarm.net.ports); None where links have no fast side
    fast_socket: socket.socket | None = None


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    """`first`, then `second` (what the compute thread runs after a round of reads: the
    steps the round brought, then what is best done once their frames have gone on)."""

    def both() -> None:
        first()
        second()

    return both


def _own_delivery(
    inbox: Inbox, me: NodeId, steps: ThreadSteps | None
) -> Callable[[Message], Awaitable[None]]:
    """What this node's links call with a message to itself: a decode or verify step for
    its own layers goes to the compute thread and on from there (one wake-up of the
    thread, none of the loop); anything else to the inbox."""
    to_inbox = inbox.own_delivery(me)

    async def deliver(message: Message) -> None:
        if not (
            isinstance(message, StepMessage) and steps is not None and steps.offer_own(message)
        ):
            await to_inbox(message)

    return deliver


class HopSide:
    def __init__(
        self,
        parts: HopParts,
        inbox: Inbox,
        hop: HopServer,
        gate: LeavingGate,
        rebalancer: Rebalancer,
        reloader: Reloader,
        config: Config,
        thread_steps: ThreadSteps | None = None,
        fast: FastListener | None = None,
    ) -> None:
        """`thread_steps`, `fast`: the compute thread's path for decode steps and the fast
        links it reads them from (None where links have no fast side)."""
        self._parts = parts
        self.inbox = inbox
        self.hop = hop
        self.serving = hop.core.serving
        self.gate = gate
        self.rebalancer = rebalancer
        self.reloader = reloader
        self.thread_steps = thread_steps
        self.fast = fast
        self._drain_timeout_s = config.net.drain_timeout_s
        self._settle_s = config.membership.settle_s
        self._prompt_folder = folder_of(config.node.state_dir, parts.membership.local.node_id)
        # where the node keeps its prompt blocks as it stops: 0 keeps none on disk
        self._disk_bytes = config.runtime.prompt_cache_disk_bytes
        if not config.runtime.prompt_cache:
            self._disk_bytes = 0

    @classmethod
    def create(
        cls, config: Config, parts: HopParts, frames: FrameCodec, own_entry: OwnEntry
    ) -> HopSide:
        """`own_entry`: this node's entry, which the compute thread serves where it reads
        fast links."""
        runtime, compute, links = config.runtime, parts.compute, parts.links
        membership = parts.membership
        serving = Serving()
        batcher = (
            DecodeBatcher(compute, serving, runtime.max_batch) if runtime.max_batch > 1 else None
        )
        tokens = runtime.prefill_batch_tokens
        prefill = (
            PrefillBatcher(compute, serving, runtime.max_batch, tokens) if tokens > 0 else None
        )
        me = membership.local.node_id
        core = HopCore(me, serving, links, HopLedger(me, parts.speed))
        hop = HopServer(core, compute, batcher, prefill)
        moving = RebalancerParts(
            parts.context, compute, membership, serving, parts.speed, parts.transfer
        )
        rebalancer = Rebalancer.create(config, moving)
        reloader = Reloader(config, moving)  # takes turns with the rebalancer's moves
        covered = lambda: placement.covered_by_others(  # noqa: E731
            serving.span, membership.routable(), me
        )
        gate = LeavingGate(hop, links, covered)
        loop = asyncio.get_running_loop()
        listening = parts.fast_socket if links.fast is not None else None
        fast_port = 0 if listening is None else listening.getsockname()[1]
        inbox = Inbox(frames, config.net, loop, fast_port)
        steps, fast = None, None
        if listening is not None:
            batch = max(1, runtime.max_batch)
            steps = ThreadSteps(core, gate, inbox, links, loop, compute, own_entry, batch)
            fast = FastListener(frames, config.net, compute, steps.take, inbox.refusals, listening)
            compute.after_reads(_then(steps.flush, fast.refill))
        links.loop_back(membership.local.address, _own_delivery(inbox, me, steps))
        return cls(parts, inbox, hop, gate, rebalancer, reloader, config, steps, fast)

    async def run(self) -> None:
        parts = self._parts
        inbox = serve_inbox(
            self.inbox, self.gate, parts.waiters, parts.membership.round_trips, self.reloader.asked
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(inbox, name="inbox")
                group.create_task(self.rebalancer.run(), name="rebalancer")
                if self.fast is not None:
                    group.create_task(self.fast.accept(), name="fast-links")
        finally:
            if self.fast is not None:
                await self.fast.close()

    async def write_prompt_cache(self) -> int:
        """As the node stops: its current shard's kept prompt blocks to its state folder,
        read back when it serves the same layers again; how many were written."""
        shard = self.serving.shard
        if shard is None or self._disk_bytes <= 0:
            return 0
        return await self._parts.compute.run(
            write_kept, self._parts.context, shard, self._prompt_folder, self._disk_bytes
        )

    def hop_sessions(self) -> int:
        """Sessions whose KV caches this node's hop holds."""
        return sum(len(shard.kv.sessions()) for shard in self.serving.all())

    async def drain(self) -> None:
        """Announce that this node is leaving, so the others plan without it and cover its
        layers first (make-before-break), and let the hop sessions it holds finish; sessions
        that start meanwhile go elsewhere once its layers are covered; it leaves a few gossip
        rounds after that (`membership.settle_s`, as a move gives up layers). When
        `net.drain_timeout_s` runs out it leaves anyway. Then it answers every step with an
        error frame and closes the links peers hold to it, so their entries re-route and
        replay at once instead of waiting for a deadline."""
        membership = self._parts.membership
        me = membership.local
        membership.publish(dataclasses.replace(me, draining=True))
        self.gate.draining = True

        def handed_over() -> bool:
            return self.gate.covered() and self.hop_sessions() == 0

        deadline = time.monotonic() + self._drain_timeout_s
        covered = False
        while not covered and await until(handed_over, deadline - time.monotonic()):
            # the new owners' spans have reached this node; a few gossip rounds more and they
            # reach every other node before this one's leave does, so that no view, however
            # its gossip came, has this node gone and its layers not yet taken over. The
            # cover must still hold then: a member seen covering these layers may have been
            # moving off them in a re-plan that counted on this node
            await asyncio.sleep(self._settle_s)
            covered = handed_over()
        if not covered:
            log.warning(
                "leaving with %d hop sessions in flight; their entries will re-route",
                self.hop_sessions(),
            )
        self.gate.gone = True
        if self.fast is not None:
            self.fast.close_all()
        await self.inbox.close_all()

    def status(self) -> HopReport:
        loads, kept = [], []
        for shard in self.serving.all():
            held, nbytes = shard.kv.snapshot()
            budget = shard.kv.budget_bytes
            loads.append(HopLoad(kv_sessions=held, kv_used_bytes=nbytes, kv_budget_bytes=budget))
            blocks = shard.kv.prefixes
            c = blocks.counts
            kept.append(
                PromptCacheLoad(
                    len(blocks), blocks.used_bytes, c.adopted, c.missing, c.kept, c.evicted
                )
            )
        batcher, steps = self.hop.batcher, self.thread_steps
        if batcher is not None:
            loads.append(HopLoad(batches=batcher.batches, batched_steps=batcher.jobs))
        reloader = self.reloader
        loads.append(HopLoad(reloads=reloader.done, reloads_refused=reloader.refused))
        if steps is not None:  # the steps run where their frames arrived are batched there
            loads.append(
                HopLoad(batches=steps.batches, batched_steps=steps.steps, thread_steps=steps.steps)
            )
        plan = self.rebalancer.plan
        return HopReport(
            layers=self._parts.context.num_layers,
            plan=None
            if plan is None
            else PlanReport(
                spans={
                    node_id: None if s is None else (s.start, s.end) for node_id, s in plan.spans
                },
                bottleneck_tokens_per_s=round(plan.bottleneck, 3),
                hops=plan.hops,
                decision="" if self.rebalancer.last is None else describe(self.rebalancer.last),
            ),
            load=summed(HopLoad, loads),
            prompt_cache=summed(PromptCacheLoad, kept),
        )
