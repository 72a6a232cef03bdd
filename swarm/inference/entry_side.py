"""The entry side of a node: the requests it is the entry of. The service turns each into a
Generation, the pipeline carries its steps through the swarm, the waiters hold the steps in
flight."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

from swarm.config import Config
from swarm.inference.ahead import StepsAhead
from swarm.inference.head import EntryHead
from swarm.inference.prompt_keys import KeptBlocks
from swarm.inference.remote import RemotePipeline
from swarm.inference.route_choice import route_chooser
from swarm.inference.service import InferenceService
from swarm.inference.waiters import StepWaiters
from swarm.membership.subsystem import Membership
from swarm.net.links import Links
from swarm.polling import until
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.draft_model import DraftModel
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.kept_prompts import folder_of
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.kv_cache import KVShape
from swarm.schema import EntryLoad, SessionRow, SpeculationReport, SpotCheckReport
from swarm.wire import Peer

log = logging.getLogger(__name__)

_DEFAULT_CONTEXT = 2048  # tokens, for a checkpoint that does not say its context length


@dataclass(frozen=True)
class EntryReport:
    model_name: str
    sessions: tuple[SessionRow, ...]  # requests in flight with this node as entry
    load: EntryLoad  # the requests in flight and the head's work for them
    speculation: SpeculationReport
    spot_checks: SpotCheckReport


def kv_bytes_per_token_layer(context: ModelContext) -> int:
    """What one token of a session takes in one layer's KV cache, as the hops keep it."""
    config = context.config
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    return KVShape(
        (0,), kv_heads, context.head_dim, context.dtype, context.device
    ).bytes_per_token()


async def open_draft_model(
    config: Config, compute: ComputeThread, target: EntryModel
) -> DraftModel | None:
    """The draft model speculation.draft_model names, loaded on the compute thread (None where
    none is named or speculation is off). ConfigError where its vocabulary is not the
    target's."""
    name = config.speculation.draft_model
    if not name or not config.speculation.enabled:
        return None
    return await compute.run(DraftModel.load, name, config.runtime, target)


def _sent_blocks(path: Path | None) -> KeptBlocks:
    """Which prompt blocks the entry sent through each hop before it restarted, read from
    `path` (None: none kept on disk); a file that cannot be read is deleted."""
    if path is None:
        return KeptBlocks()
    try:
        return KeptBlocks.read(path)
    except (ValueError, OSError) as e:
        log.warning("not reading %s: %s; deleting it", path, e)
        path.unlink(missing_ok=True)
        return KeptBlocks()


class EntrySide:
    def __init__(
        self,
        model_name: str,
        pipeline: RemotePipeline,
        service: InferenceService,
        kept_path: Path | None = None,
    ) -> None:
        """`kept_path`: where the entry keeps, across a restart, which prompt blocks it sent
        through each hop (None: nowhere)."""
        self._model_name = model_name
        self.pipeline = pipeline
        self.service = service
        self._kept_path = kept_path

    def write_prompt_keys(self) -> None:
        """As the node stops: which prompt blocks it sent through each hop, for the hops
        that read theirs back after a restart (`kept_prompts.py`)."""
        if self._kept_path is None:
            return
        try:
            self._kept_path.parent.mkdir(parents=True, exist_ok=True)
            self.pipeline.kept.save(self._kept_path)
        except OSError as e:
            log.warning("could not write %s: %s", self._kept_path, e)

    @classmethod
    def create(
        cls,
        config: Config,
        context: ModelContext,
        entry: EntryModel,
        compute: ComputeThread,
        links: Links,
        membership: Membership,
        waiters: StepWaiters,
        draft_model: DraftModel | None = None,
        heads_where_results_arrive: bool = False,
    ) -> EntrySide:
        """`heads_where_results_arrive`: the compute thread reads fast links and runs a plain
        decode step's head on its result there (`EntryHead`'s `claim`)."""
        local = membership.local
        me = Peer(local.node_id, local.address)
        chooser = route_chooser(
            membership.routable,
            context.num_layers,
            membership.round_trips.snapshot,
            kv_bytes_per_token_layer(context),
            membership.standing,
        )
        claim = waiters.claim if heads_where_results_arrive else None
        runtime = config.runtime
        head = EntryHead(entry, compute, runtime.max_batch, config.speculation, draft_model, claim)
        kept_on_disk = runtime.prompt_cache and runtime.prompt_cache_disk_bytes > 0
        folder = folder_of(config.node.state_dir, me.node_id)
        kept_path = folder / "sent-blocks.json" if kept_on_disk else None
        # plain decode steps the compute thread sends as soon as the head sampled their token
        ahead = StepsAhead(waiters, itertools.count(), asyncio.get_running_loop())
        pipeline = RemotePipeline(
            me,
            links,
            ahead,
            chooser,
            membership.round_trips,
            config.net,
            membership.failures,
            config.runtime.prefill_chunk_tokens,
            lambda: {r.node_id: r.incarnation for r in membership.routable()},
            lambda: head.ms_per_session,
            kept=_sent_blocks(kept_path) if runtime.prompt_cache else None,
            standing=membership.standing,
        )
        context_tokens = int(getattr(context.config, "max_position_embeddings", _DEFAULT_CONTEXT))
        model = local.names[0]  # the name every node of the swarm gives the model
        service = InferenceService(
            model, entry, pipeline, compute, context_tokens, config.runtime.max_batch, head
        )
        return cls(model, pipeline, service, kept_path)

    async def run(self) -> None:
        """Nothing runs on its own here: requests arrive through the HTTP subsystem."""

    async def drain(self) -> None:
        """Take no new requests and wait for those in flight: their HTTP responses come from
        this process, so they cannot be handed off (a second signal stops the node at once)."""
        self.service.accepting = False
        await until(lambda: self.service.in_flight == 0, None)

    def status(self) -> EntryReport:
        sessions = tuple(
            SessionRow(session, tuple(hop.node_id for hop in trace.route.hops))
            for session, trace in list(self.pipeline.traces.items())
        )
        head = self.service.head
        model = head.draft_model
        drafts = head.drafts.report(model.name if model is not None else "")
        tally = self.pipeline.checks.tally
        load = EntryLoad(
            sessions=len(sessions),
            batches=head.batcher.batches + head.thread_batches,
            batched_steps=head.batcher.jobs + head.thread_steps,
            thread_steps=head.thread_steps,
            sent_ahead=self.pipeline.ahead.count,
            spot_checks=tally.checks,
            spot_check_mismatches=tally.mismatches,
            spot_checks_undecided=tally.undecided,
        )
        checks = SpotCheckReport(
            {node: count for node, count in tally.wrong.items()},
            tuple(sorted(self.pipeline.checks.convicted())),
            {node: count for node, count in tally.reloads_asked.items()},
        )
        return EntryReport(self._model_name, sessions, load, drafts, checks)
