"""The seeded Qwen3-MoE GGUF fixture (harness.moe_fixture): its file holds the planned tensors
in their Q4_K_M-like types, its router spreads a prompt's tokens over the experts, and (opt-in,
the ~3 GB one) three capped node processes serve it with the one process's greedy text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.capped_swarm import capped_nodes, one_process
from harness.moe_fixture import QWEN3_MOE_3GB, QWEN3_MOE_TINY, file_bytes, moe_fixture_path
from harness.paths import FIXTURES, MODEL_CACHE
from swarm.config import RuntimeConfig
from swarm.runtime.checkpoint.gguf_file import read_table
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families.moe import MoEBlock
from swarm.types import LayerSpan, SessionId

BIG = os.environ.get("SWARM_BIG_FIXTURES") == "1"


@pytest.fixture(scope="module")
def tiny() -> Path:
    return moe_fixture_path(QWEN3_MOE_TINY, FIXTURES)


def test_the_file_holds_the_planned_types_and_is_reused(tiny: Path) -> None:
    table = read_table(tiny)
    types = {name: t.qtype for name, t in table.tensors.items()}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    assert types["blk.0.ffn_down_exps.weight"] == "Q4_K"
    assert types["blk.1.ffn_down_exps.weight"] == "Q6_K"  # the last eighth: more bits
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["output.weight"] == "Q6_K"
    assert table.architecture == "qwen3moe"
    assert sum(t.nbytes for t in table.tensors.values()) == file_bytes(QWEN3_MOE_TINY)
    stamp = tiny.stat().st_mtime_ns
    assert moe_fixture_path(QWEN3_MOE_TINY, FIXTURES).stat().st_mtime_ns == stamp


def test_a_prompt_routes_to_most_experts_in_every_layer(tiny: Path, tmp_path: Path) -> None:
    runtime = RuntimeConfig(model=str(tiny), cache_dir=tmp_path, threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    shard = Shard.load(context, span, runtime)
    ids = entry.encode_text(
        "The keeper climbed the stairs of the lighthouse at dusk, as every night, lit the lamp "
        "and wrote the weather in the log: wind from the north-west, rain at midnight, a "
        "freighter passing south with its lights low, and gulls on the rocks until dawn."
    )
    shard.forward(SessionId("s"), entry.embed(ids), 0)
    spec = QWEN3_MOE_TINY
    for i in span:
        block = shard.block(i)
        assert isinstance(block, MoEBlock)
        # uniform routing of this many tokens hits nearly all 64; a degenerate router ~top k
        assert len(ids) * spec.top_k >= 4 * spec.experts
        assert len(block.experts.last_experts) >= 3 * spec.experts // 4, i


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(
    not BIG,
    reason="writes and serves a ~3 GB Qwen3-MoE GGUF (~6 GB of memory, minutes): "
    "set SWARM_BIG_FIXTURES=1",
)
async def test_three_capped_nodes_serve_the_3gb_moe_with_one_process_text() -> None:
    path = moe_fixture_path(QWEN3_MOE_3GB, FIXTURES)
    runtime = RuntimeConfig(model=str(path), cache_dir=MODEL_CACHE, threads=1)
    prompt = "Write a story about a lighthouse keeper who finds a message in a bottle."
    # the nodes first: the whole model, once loaded here, stays resident in this process
    (swarm,), nodes, _ = await capped_nodes(runtime, prompt, 12, 3)
    (alone,), _ = await one_process(runtime, prompt, 12)
    assert alone.tokens == 12
    assert swarm.text == alone.text
    spans = sorted(n.span for n in nodes if n.span is not None)
    assert len(spans) == 3
    assert all(end - start < QWEN3_MOE_3GB.layers for start, end in spans)
    assert spans[0][0] == 0
    assert spans[-1][1] == QWEN3_MOE_3GB.layers
