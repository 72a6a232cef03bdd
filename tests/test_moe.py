"""Mixture-of-experts layers: experts stay in the file's own type and run on that type's
products; a step computes only the experts its rows route to (the experts transformers' own
router picks), a batch of sessions once per expert; placement counts every expert's bytes;
variants no adapter implements are refused in one line naming them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from harness.block_bytes import BYTE_GROUP_ROWS, KQUANT_ROWS, rows_rounded
from harness.family_models import (
    PROMPT,
    SPECS,
    Checkpoint,
    build_model,
    dequantized_experts,
    family_config,
    reference_tokens,
    write_gguf,
)
from harness.family_runs import swarm_tokens
from swarm.config import RuntimeConfig
from swarm.errors import UnsupportedModelError
from swarm.runtime.checkpoint.gguf_file import read_table
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families import family_for
from swarm.runtime.families.gpt_oss import GptOssExperts
from swarm.runtime.families.moe import MoEBlock, SparseExperts
from swarm.runtime.weights import native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.telemetry import bytes_per_layer
from swarm.types import LayerSpan, SessionId

# wide enough for the 256-column blocks of the k-quants
WIDE = dataclasses.replace(
    SPECS["qwen3_moe"],
    layers=2,
    split="0:1,1:2",
    overrides={
        **SPECS["qwen3_moe"].overrides,
        "hidden_size": 256,
        "moe_intermediate_size": 256,
        "num_experts": 4,
    },
)
QUANT_TOKENS = 12
EXPERT_KINDS = {  # what a CPU node runs each type's experts on
    "Q8_0": NativeBlockMatrix,
    "Q6_K": NativeBlockMatrix,
    "Q4_K": NativeBlockMatrix,
    "Q4_0": NativeBlockMatrix,
    "MXFP4": NativeBlockMatrix,
    "BF16": torch.Tensor,  # float types run as the runtime's floats
    "F16": torch.Tensor,
}


def _with_file_experts(model: Any, qtype: str) -> Any:
    """The model transformers runs from the file: experts as `qtype` holds them."""
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            for param in (experts.gate_up_proj, experts.down_proj):
                inner = param.shape[1] // 2 if param is experts.gate_up_proj else param.shape[1]
                halves = torch.split(param, inner, dim=1)  # gate and up are stored apart
                held = [dequantized_experts(h.numpy(), qtype) for h in halves]
                param.copy_(torch.from_numpy(np.concatenate(held, axis=1)))
    return model


def _rounded_experts(
    qtype: str,
    experts: Any,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """transformers' expert products (Qwen3MoeExperts' eager forward), each taking its input
    as swarm's rows of `qtype` do."""
    out = torch.zeros_like(hidden)
    for token in range(hidden.shape[0]):
        x = rows_rounded(hidden[token : token + 1], qtype)
        for expert, weight in zip(top_k_index[token].tolist(), top_k_weights[token], strict=True):
            gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[expert]).chunk(2, dim=-1)
            inner = rows_rounded(experts.act_fn(gate) * up, qtype)
            out[token] += weight * torch.nn.functional.linear(inner, experts.down_proj[expert])[0]
    return out


@contextlib.contextmanager
def _expert_inputs_rounded(model: Any, qtype: str) -> Iterator[None]:
    """Every layer of `model` runs `_rounded_experts` meanwhile."""
    with contextlib.ExitStack() as stack:
        for layer in model.model.layers:
            experts = layer.mlp.experts
            rounded = functools.partial(_rounded_experts, qtype, experts)
            stack.enter_context(mock.patch.object(experts, "forward", rounded, create=True))
        yield


def _blocks(context: ModelContext, runtime: RuntimeConfig) -> list[MoEBlock]:
    shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
    blocks = [shard.block(i) for i in range(context.num_layers)]
    assert all(isinstance(b, MoEBlock) for b in blocks)
    return blocks  # type: ignore[return-value]


@pytest.mark.parametrize("qtype", sorted(EXPERT_KINDS))
async def test_experts_run_packed_in_the_files_type(qtype: str, tmp_path: Path) -> None:
    model = build_model(WIDE)
    path = write_gguf(model, WIDE, tmp_path / f"wide-{qtype}.gguf", expert_type=qtype)
    runtime = RuntimeConfig(model=str(path), cache_dir=tmp_path / "cache", threads=1)
    context = ModelContext.open(runtime, progress=False)
    table = read_table(path)
    for index, block in enumerate(_blocks(context, runtime)):
        experts = block.experts
        matrices = [*experts.gate_up, *experts.down]
        assert all(isinstance(m, EXPERT_KINDS[qtype]) for m in matrices), type(matrices[0])
        # packed experts run as one call of swarm's kernels per step; float ones on torch's
        assert experts.rows_alone == (EXPERT_KINDS[qtype] is not torch.Tensor)
        if EXPERT_KINDS[qtype] is NativeBlockMatrix:  # the blocks as stored: 1.00x the file
            stored = sum(
                table.tensors[f"blk.{index}.ffn_{p}_exps.weight"].nbytes
                for p in ("gate", "up", "down")
            )
            assert sum(m.nbytes for m in matrices) == stored
    reference = _with_file_experts(model, qtype)
    rounds = native.available() and qtype in KQUANT_ROWS + BYTE_GROUP_ROWS  # to 8 bits
    with _expert_inputs_rounded(reference, qtype) if rounds else contextlib.nullcontext():
        expected = reference_tokens(reference, PROMPT, QUANT_TOKENS)
    assert await swarm_tokens(runtime, None, QUANT_TOKENS) == expected
    assert await swarm_tokens(runtime, WIDE.split, QUANT_TOKENS) == expected


def _gpt_oss_with_file_experts(model: Any, qtype: str) -> Any:
    """gpt-oss as transformers runs it from a file of `qtype` experts: its x @ W matrices
    (gate and up interleaved) hold what the file's transposed, de-interleaved rows hold."""
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            rows = experts.gate_up_proj.transpose(1, 2).numpy().copy()  # [experts, 2 inner, hidden]
            for half in (slice(0, None, 2), slice(1, None, 2)):
                rows[:, half] = dequantized_experts(np.ascontiguousarray(rows[:, half]), qtype)
            experts.gate_up_proj.copy_(torch.from_numpy(rows).transpose(1, 2))
            down = experts.down_proj.transpose(1, 2).numpy()  # [experts, hidden, inner]
            held = dequantized_experts(np.ascontiguousarray(down), qtype)
            experts.down_proj.copy_(torch.from_numpy(held).transpose(1, 2))
    return model


async def test_gpt_oss_mxfp4_experts_run_on_their_blocks(tmp_path: Path) -> None:
    """gpt-oss's own expert type: MXFP4 experts of a GGUF file run on the MXFP4 block kernel
    from their blocks, and give transformers' greedy tokens on the dequantized experts."""
    from swarm.runtime.families.gpt_oss import GptOssBlock

    spec = SPECS["gpt_oss"]
    model = build_model(spec)
    path = write_gguf(model, spec, tmp_path / "oss-mxfp4.gguf", expert_type="MXFP4")
    runtime = RuntimeConfig(model=str(path), cache_dir=tmp_path / "cache", threads=1)
    context = ModelContext.open(runtime, progress=False)
    shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
    table = read_table(path)
    for index in range(context.num_layers):
        block = shard.block(index)
        assert isinstance(block, GptOssBlock)
        experts = _experts(block).per_expert
        assert experts is not None
        matrices = [m for gate_up, _, down, _ in experts for m in (gate_up, down)]
        assert all(isinstance(m, NativeBlockMatrix) and m.qtype == "MXFP4" for m in matrices)
        stored = sum(
            table.tensors[f"blk.{index}.ffn_{p}_exps.weight"].nbytes for p in ("gate", "up", "down")
        )
        assert sum(m.nbytes for m in matrices) == stored
        assert _experts(block).rows_alone  # one call of swarm's kernels per step
    expected = reference_tokens(_gpt_oss_with_file_experts(model, "MXFP4"), PROMPT, QUANT_TOKENS)
    assert await swarm_tokens(runtime, None, QUANT_TOKENS) == expected
    assert await swarm_tokens(runtime, spec.split, QUANT_TOKENS) == expected


def test_placement_counts_every_expert(
    family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """What placement believes a layer costs is all its bytes, every expert's, not the few a
    token uses."""
    checkpoint = family_checkpoints["qwen3_moe", "gguf"]
    runtime = RuntimeConfig(model=str(checkpoint.path), cache_dir=family_cache, threads=1)
    context = ModelContext.open(runtime, progress=False)
    table = read_table(checkpoint.path)
    layer = sum(t.nbytes for name, t in table.tensors.items() if name.startswith("blk.0."))
    experts = sum(t.nbytes for name, t in table.tensors.items() if name.startswith("blk.0.ffn_"))
    config = checkpoint.model.config
    active = experts * config.num_experts_per_tok // config.num_experts  # 2 of 8
    assert layer - experts + active < bytes_per_layer(context) == layer


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_a_step_runs_only_the_experts_transformers_routes_to(
    family: str, family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """One session's decode step runs its top k experts, the ones transformers' router picks
    for the same hidden state; a batch of sessions runs the union of theirs, each expert once,
    and every session gets what it gets alone."""
    checkpoint = family_checkpoints[family, "hf"]
    runtime = RuntimeConfig(model=str(checkpoint.path), cache_dir=family_cache, threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    batched, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    routers = [layer.mlp.gate for layer in checkpoint.model.model.layers]
    prompts = {SessionId(f"s{i}"): PROMPT[: 8 + 6 * i] for i in range(4)}
    for session, prompt in prompts.items():
        batched.forward(session, entry.embed(prompt), 0)
        alone.forward(session, entry.embed(prompt), 0)
    steps = [(s, entry.embed([7 + i]), len(p)) for i, (s, p) in enumerate(prompts.items())]
    chosen: list[set[int]] = [set() for _ in routers]
    expected = []
    for session, hidden, position in steps:
        expected.append(_routed_alone(alone, routers, chosen, session, hidden, position))
    results = batched.decode_batch(steps, span)
    for i, block in enumerate(batched.block(j) for j in span):
        assert isinstance(block, MoEBlock)
        assert set(block.experts.last_experts) == chosen[i]
        assert len(chosen[i]) < block.experts.routing.experts
    for result, want in zip(results, expected, strict=True):
        assert isinstance(result, torch.Tensor)
        torch.testing.assert_close(result, want)


def _experts(block: Any) -> Any:
    """The module that stands in for a layer's sparse MLP (MoEBlock's or gpt-oss's)."""
    experts = block.experts if isinstance(block, MoEBlock) else block._layer.mlp
    assert isinstance(experts, SparseExperts | GptOssExperts)
    return experts


def _routed_alone(
    shard: Shard,
    routers: list[Any],
    chosen: list[set[int]],
    session: SessionId,
    hidden: torch.Tensor,
    position: int,
) -> torch.Tensor:
    """One session's step alone, checking each layer ran exactly transformers' top k."""
    experts = [_experts(shard.block(i)) for i in range(len(routers))]
    captured: list[torch.Tensor] = []
    handles = [
        e.register_forward_pre_hook(lambda _, args: captured.append(args[0])) for e in experts
    ]
    try:
        out = shard.forward(session, hidden, position)
    finally:
        for handle in handles:
            handle.remove()
    for i, (ran, router, seen) in enumerate(zip(experts, routers, captured, strict=True)):
        with torch.inference_mode():
            _, _, top = router(seen.reshape(-1, seen.shape[-1]))
        assert ran.last_experts == tuple(sorted(set(top.flatten().tolist())))
        assert len(ran.last_experts) == router.top_k
        chosen[i] |= set(ran.last_experts)
    return out


def test_a_gpt_oss_step_runs_only_the_experts_transformers_routes_to(
    family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """gpt-oss's router (logits with a bias, softmax over the top k) picks the same experts
    as transformers' for every session's decode step."""
    checkpoint = family_checkpoints["gpt_oss", "hf"]
    runtime = RuntimeConfig(model=str(checkpoint.path), cache_dir=family_cache, threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
    routers = [layer.mlp.router for layer in checkpoint.model.model.layers]
    chosen: list[set[int]] = [set() for _ in routers]
    for i, prompt in enumerate((PROMPT[:8], PROMPT[:20], PROMPT)):
        session = SessionId(f"oss-{i}")
        shard.forward(session, entry.embed(prompt), 0)
        _routed_alone(shard, routers, chosen, session, entry.embed([7 + i]), len(prompt))
    assert all(len(c) >= routers[0].top_k for c in chosen)  # every layer ran its experts


def test_moe_variants_not_implemented_are_refused_in_one_line(tmp_path: Path) -> None:
    import gguf
    from transformers import Qwen2MoeConfig

    shared = Qwen2MoeConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2)
    with pytest.raises(UnsupportedModelError, match=r"'qwen2_moe' \(mixture of experts\)"):
        family_for(shared)
    dense_layers = dataclasses.replace(
        SPECS["qwen3_moe"], overrides={**SPECS["qwen3_moe"].overrides, "mlp_only_layers": [1]}
    )
    with pytest.raises(UnsupportedModelError, match="'qwen3_moe' with dense layers"):
        family_for(family_config(dense_layers))
    mxfp4 = family_config(SPECS["gpt_oss"])  # the published folders' experts
    mxfp4.quantization_config = {"quant_method": "mxfp4"}
    with pytest.raises(UnsupportedModelError, match="'gpt_oss' with mxfp4 experts"):
        family_for(mxfp4)
    # a qwen2moe file: refused by its family before its tensors (of a type swarm refuses)
    path = tmp_path / "qwen2moe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2moe")
    blocks = np.zeros((32, 36), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_up_exps.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"'qwen2_moe' \(mixture of experts\)"):
        ModelStore.open(str(path), tmp_path / "cache", progress=False)


async def test_a_mixtral_gguf_of_one_tensor_per_expert_runs_as_the_3d_one(
    family_checkpoints: dict[tuple[str, str], Checkpoint], tmp_path: Path
) -> None:
    """llama.cpp's first Mixtral files keep each expert as its own tensor
    (blk.N.ffn_gate.E.weight): the same store parts, the same tokens."""
    checkpoint = family_checkpoints["mixtral", "gguf"]
    path = write_gguf(
        checkpoint.model, checkpoint.spec, tmp_path / "old.gguf", expert_per_tensor=True
    )
    assert "blk.0.ffn_gate.3.weight" in read_table(path).tensors
    runtime = RuntimeConfig(model=str(path), cache_dir=tmp_path / "cache", threads=1)
    assert await swarm_tokens(runtime, None) == checkpoint.expected
    assert await swarm_tokens(runtime, checkpoint.spec.split) == checkpoint.expected


def test_a_gguf_with_gate_and_up_fused_is_refused(
    family_checkpoints: dict[tuple[str, str], Checkpoint], tmp_path: Path
) -> None:
    checkpoint = family_checkpoints["qwen3_moe", "hf"]
    fused = {"blk.0.ffn_gate_up_exps.weight": np.zeros((8, 64, 64), dtype=np.float32)}
    path = write_gguf(checkpoint.model, checkpoint.spec, tmp_path / "fused.gguf", tensors=fused)
    with pytest.raises(UnsupportedModelError, match=r"ffn_gate_up_exps\.weight: experts with gate"):
        ModelStore.open(str(path), tmp_path / "cache", progress=False)


def test_a_gguf_with_shared_experts_is_refused(
    family_checkpoints: dict[tuple[str, str], Checkpoint], tmp_path: Path
) -> None:
    checkpoint = family_checkpoints["qwen3_moe", "hf"]
    path = write_gguf(
        checkpoint.model,
        checkpoint.spec,
        tmp_path / "shared.gguf",
        strings={"qwen3moe.expert_shared_count": "1"},
    )
    with pytest.raises(UnsupportedModelError, match="1 shared experts is not supported"):
        ModelStore.open(str(path), tmp_path / "cache", progress=False)


async def test_packed_experts_give_a_batched_session_its_bits_alone(tmp_path: Path) -> None:
    """On swarm's kernels a decode step of several sessions gives each the bits it gets alone
    (attention, router and experts compute each row alone), so verify steps and failover
    replays may batch: the layer says so."""
    model = build_model(WIDE)
    path = write_gguf(model, WIDE, tmp_path / "wide-q4k.gguf", expert_type="Q4_K")
    # int8: the file's float attention on the int8 kernel, as a quantized file's would run
    runtime = RuntimeConfig(model=str(path), cache_dir=tmp_path / "cache", threads=1, dtype="int8")
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    batched, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    prompts = {SessionId(f"s{i}"): PROMPT[: 8 + 5 * i] for i in range(3)}
    for session, prompt in prompts.items():
        batched.forward(session, entry.embed(prompt), 0)
        alone.forward(session, entry.embed(prompt), 0)
    steps = [(s, entry.embed([9 + i]), len(p)) for i, (s, p) in enumerate(prompts.items())]
    together = batched.decode_batch(steps, span)
    for (session, hidden, position), result in zip(steps, together, strict=True):
        assert torch.equal(alone.forward(session, hidden, position), result)
    block = batched.block(0)
    assert isinstance(block, MoEBlock) and block.experts.rows_alone
