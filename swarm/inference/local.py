"""The whole model in one process: an entry plus shards chained by a LocalPipeline."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.config import RuntimeConfig
from swarm.inference.pipeline import LocalPipeline
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, parse_split


@dataclass
class LocalSwarm:
    entry: EntryModel
    pipeline: LocalPipeline
    compute: ComputeThread


async def load_local(runtime: RuntimeConfig, split: str | None = None) -> LocalSwarm:
    """Load on the compute thread (disk reads and tensor copies stay off the event loop)."""
    compute = ComputeThread(runtime.threads, runtime.compute_queue_size)
    try:
        context = await compute.run(ModelContext.open, runtime)
        spans = (
            parse_split(split, context.num_layers) if split else [LayerSpan(0, context.num_layers)]
        )
        entry = await compute.run(EntryModel, context)
        shards = [await compute.run(Shard.load, context, span, runtime) for span in spans]
    except BaseException:
        compute.close()
        raise
    pipeline = LocalPipeline(
        shards, compute, runtime.prefill_chunk_tokens, keep_prompts=runtime.prompt_cache
    )
    return LocalSwarm(entry, pipeline, compute)
