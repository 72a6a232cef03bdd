"""Packed GGUF weights: block decoding against the gguf package, K-quant packing, the CPU
kernels against the dequantized matrix, the store reading only the parts a node loads, and the
bad inputs (unsupported type, truncated file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.block_bytes import random_blocks as random_blocks_of
from harness.gguf_fixture import LLAMA_TINY, fixture_path, random_blocks
from harness.kquants import pack_q4_k, pack_q6_k, quantize_q4_k, quantize_q6_k
from swarm.config import RuntimeConfig
from swarm.errors import CorruptModelError
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.positions import Rotary
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families import build_block, generic
from swarm.runtime.kv_cache import KVCacheManager, KVShape
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.packed import (
    HeadShortlist,
    Int4Matrix,
    Matrices,
    NativeQ4Matrix,
    PackedTensor,
    StackedMatrix,
    int8_from_packed,
)
from swarm.runtime.weights.quant import Int8Weight
from swarm.telemetry import bytes_per_layer
from swarm.types import LayerSpan, SessionId


def _random_raw(qtype: str, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Random bytes for every field, with sane float16 scales."""
    rng = np.random.default_rng(seed)
    fmt = ggml.FORMATS[qtype]
    raw = rng.integers(0, 256, (rows * blocks_per_row, fmt.nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, (raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    fields = [slice(208, 210)] if qtype == "Q6_K" else [slice(0, 2)]
    if qtype in ("Q4_1", "Q4_K", "Q5_K"):
        fields.append(slice(2, 4))
    for i, where in enumerate(fields):
        raw[:, where] = scales[:, 2 * i : 2 * i + 2] if i == 0 else scales[:, :2]
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", sorted(ggml.FORMATS))
def test_decoding_matches_the_gguf_dequantizer(qtype: str) -> None:
    from gguf import GGMLQuantizationType, dequantize

    raw = _random_raw(qtype, rows=6, blocks_per_row=2)
    cols = 2 * ggml.FORMATS[qtype].elements
    expected = dequantize(raw, GGMLQuantizationType[qtype])
    decoded = ggml.decode(qtype, torch.from_numpy(raw), cols)
    assert torch.equal(decoded.dequantize(), torch.from_numpy(expected))
    packed = PackedTensor(qtype, torch.from_numpy(raw), cols)
    assert torch.equal(packed.rows(torch.tensor([4, 1])), torch.from_numpy(expected[[4, 1]]))


def test_k_quant_packing_lays_out_bits_as_ggml() -> None:
    from gguf import GGMLQuantizationType, dequantize

    rng = np.random.default_rng(1)
    n = 4
    d = rng.uniform(0.01, 0.1, n).astype(np.float16).astype(np.float32)
    dmin = rng.uniform(0.01, 0.1, n).astype(np.float16).astype(np.float32)
    sc, mn = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    q4 = rng.integers(0, 16, (n, 256))
    got = dequantize(pack_q4_k(d, dmin, sc, mn, q4), GGMLQuantizationType.Q4_K)
    want = (d[:, None] * sc)[..., None] * q4.reshape(n, 8, 32) - (dmin[:, None] * mn)[..., None]
    np.testing.assert_array_equal(got.reshape(n, 8, 32), want.astype(np.float32))
    sc6, q6 = rng.integers(-128, 128, (n, 16)), rng.integers(0, 64, (n, 256))
    got = dequantize(pack_q6_k(d, sc6, q6), GGMLQuantizationType.Q6_K)
    want = (d[:, None] * sc6)[..., None] * (q6.reshape(n, 16, 16) - 32)
    np.testing.assert_array_equal(got.reshape(n, 16, 16), want.astype(np.float32))


@pytest.mark.parametrize(
    ("quantize", "qtype", "levels"),
    [
        (quantize_q4_k, "Q4_K", 15),
        (quantize_q6_k, "Q6_K", 63),
    ],
)
def test_k_quant_quantizers_round_to_their_grid(quantize, qtype: str, levels: int) -> None:  # type: ignore[no-untyped-def]
    from gguf import GGMLQuantizationType, dequantize

    x = np.random.default_rng(2).normal(0, 0.02, (32, 512)).astype(np.float32)
    back = dequantize(quantize(x), GGMLQuantizationType[qtype])
    # within about one step of each (sub-)block's range, with 6-bit scales rounding on top
    step = (x.max() - x.min()) / levels
    assert np.abs(back - x).max() < step
    assert np.abs(back - x).mean() < step / 3


@pytest.mark.parametrize("qtype", sorted(ggml.BLOCKS))
def test_cpu_kernels_follow_the_dequantized_matrix(qtype: str) -> None:
    elements = ggml.BLOCKS[qtype].elements
    raw = random_blocks_of(np.random.default_rng(3), 64 * 512 // elements, qtype)
    packed = PackedTensor(qtype, torch.from_numpy(raw.reshape(64, -1)), 512)
    matrix = Matrices(torch.device("cpu")).fused([packed])
    four_bit = NativeQ4Matrix if native.available() else Int4Matrix
    others = NativeBlockMatrix if native.available() else Int8Weight
    # Q4_K runs on its own blocks where swarm's kernels are, on torch's int4 where not
    groups = ("Q4_1",) if native.available() else ("Q4_0", "Q4_1", "Q4_K")
    assert isinstance(matrix, four_bit if qtype in groups else others)
    x = torch.randn(3, packed.cols)
    want = x @ packed.dequantize().T
    got = matrix.matmul(x)
    # bfloat16 (torch) or int16-per-group (swarm's kernels) activations
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    # a 4-bit layout adds a 16-bit zero per group; the block kernels keep the blocks; int8
    # takes a byte per weight (4.6x an IQ1_M file's 1.75 bits)
    bound = {four_bit: 1.12, NativeBlockMatrix: 1.0, Int8Weight: 4.7}[type(matrix)]
    assert matrix.nbytes <= bound * packed.nbytes


# swarm's kernels, where built, rank these heads as float32 does without help (int16
# activations on the blocks themselves); the int8 rows of nodes without them do not
@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])
def test_the_head_shortlist_ranks_as_float32_of_the_blocks(qtype: str) -> None:
    # many close logits (a flat, wide head), where the kernel's rounding reorders the top
    raw = _random_raw(qtype, rows=4096, blocks_per_row=1, seed=7)
    blocks = PackedTensor(qtype, torch.from_numpy(raw), ggml.FORMATS[qtype].elements)
    kernel = int8_from_packed(blocks)
    bias = torch.randn(blocks.shape[0]) * 1e-3
    x = torch.randn(512, blocks.cols)
    want = x @ blocks.dequantize().T + bias
    approx = kernel.matmul(x) + bias
    assert not torch.equal(approx.argmax(-1), want.argmax(-1))  # the case this is for
    got = HeadShortlist(blocks, bias).rescore(x, approx.clone())
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    top = want.topk(4, dim=-1)
    assert torch.allclose(got.gather(-1, top.indices), top.values, rtol=1e-5, atol=1e-6)
    # a session's logits do not depend on who else is in the head's batch
    alone = HeadShortlist(blocks, bias).rescore(x[5:6], approx[5:6].clone())
    assert torch.equal(alone[0], got[5])


def test_matrices_of_mixed_types_fuse_as_a_stack() -> None:
    q = PackedTensor("Q4_K", torch.from_numpy(_random_raw("Q4_K", 32, 1, seed=4)), 256)
    k = PackedTensor("Q4_K", torch.from_numpy(_random_raw("Q4_K", 16, 1, seed=5)), 256)
    v = PackedTensor("Q6_K", torch.from_numpy(_random_raw("Q6_K", 16, 1, seed=6)), 256)
    fused = Matrices(torch.device("cpu")).fused([q, k, v])
    assert isinstance(fused, StackedMatrix) and len(fused.parts) == 2  # q and k share a kernel
    assert tuple(fused.shape) == (64, 256)
    x = torch.randn(2, 256)
    alone = torch.cat([Matrices(torch.device("cpu")).fused([m]).matmul(x) for m in (q, k, v)], -1)
    assert torch.equal(fused.matmul(x), alone)


def _runtime(model: Path, cache: Path, dtype: str = "packed") -> RuntimeConfig:
    return RuntimeConfig(model=str(model), cache_dir=cache, dtype=dtype, threads=1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the tests that do not look at what is stored (indexing takes seconds)."""
    return tmp_path_factory.mktemp("cache")


def test_a_node_reads_only_its_span(tiny_gguf: Path, tmp_path: Path) -> None:
    runtime = _runtime(tiny_gguf, tmp_path / "cache")
    context = ModelContext.open(runtime, progress=False)
    assert context.store.stored_parts() == []
    shard = Shard.load(context, LayerSpan(1, 2), runtime)
    EntryModel(context)
    assert sorted(context.store.stored_parts()) == ["embed", "head", "layer-0001"]
    on_disk = sum(p.stat().st_size for p in context.store.folder.glob("*.safetensors"))
    wanted = sum(context.store.part_bytes(p) for p in ("embed", "head", "layer-0001"))
    assert wanted <= on_disk <= 1.01 * wanted + 64 * 1024  # plus safetensors headers
    # a re-split reuses what is stored and copies only the new layer
    Shard.load(context, LayerSpan(1, 3), runtime, reuse=shard)
    assert "layer-0002" in context.store.stored_parts()
    per_layer = bytes_per_layer(context)
    assert per_layer == max(context.store.part_bytes(f"layer-{i:04d}") for i in range(3))
    float_context = ModelContext.open(dataclasses.replace(runtime, dtype="float32"))
    assert bytes_per_layer(float_context) > 6 * per_layer


@torch.inference_mode()
def test_packed_follows_float32_of_the_same_blocks(tiny_gguf: Path, shared_cache: Path) -> None:
    logits = {}
    for dtype in ("packed", "float32"):
        runtime = _runtime(tiny_gguf, shared_cache, dtype)
        context = ModelContext.open(runtime, progress=False)
        entry = EntryModel(context)
        shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
        hidden = shard.forward(SessionId("s"), entry.embed(entry.encode_text("one two three")), 0)
        logits[dtype] = entry.logits(hidden)
    diff = (logits["packed"] - logits["float32"]).abs().max()
    assert diff < 0.03 * logits["float32"].abs().max()


@torch.inference_mode()
def test_generic_layers_run_packed_matrices(tiny_gguf: Path, shared_cache: Path) -> None:
    runtime = _runtime(tiny_gguf, shared_cache)
    context = ModelContext.open(runtime, progress=False)
    weights = context.to_runtime(context.store.load_layer(0))
    assert isinstance(weights["mlp.down_proj.weight"], PackedTensor)
    lean = build_block(context.config, context.skeleton(), 0, weights)
    hf = generic.HFBlock(context.family.paths.layer(context.skeleton(), 0), weights)
    shape = KVShape((0,), LLAMA_TINY.kv_heads, context.head_dim, torch.float32, context.device)
    out = []
    for block in (lean, hf):
        kv = KVCacheManager(shape, 1 << 20, 60.0)
        cache = kv.acquire(SessionId("s"), 0, 4)
        cache.layers = LayerSpan(0, 1)
        cache.begin_step(0, 4)
        hidden = torch.randn(1, 4, context.hidden_size, generator=torch.Generator().manual_seed(0))
        rotary = Rotary(context.family, context.config, context.skeleton(), context.device)
        cos_sin = rotary(hidden, torch.arange(4).unsqueeze(0), "full_attention")
        out.append(block(hidden, cos_sin, None, cache))
    assert torch.allclose(out[0], out[1], atol=1e-4)


def test_unsupported_type_is_named_before_anything_is_written(tmp_path: Path) -> None:
    spec = dataclasses.replace(LLAMA_TINY, types=(("blk.1.ffn_up.weight", "NVFP4"),))
    model = fixture_path(spec, tmp_path / "fixtures")
    with pytest.raises(ggml.UnsupportedQuantError) as failure:
        ModelStore.open(str(model), tmp_path / "cache", progress=False)
    message = str(failure.value)
    assert "\n" not in message
    assert "blk.1.ffn_up.weight" in message and "NVFP4" in message and "Q4_K, Q5_K, Q6_K" in message
    assert not (tmp_path / "cache").exists()


def test_truncated_gguf_fails_its_offset_check(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1000])
    with pytest.raises(CorruptModelError, match=r"cut\.gguf: truncated"):
        ModelStore.open(str(cut), tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()


def test_fixture_blocks_have_the_intended_scale() -> None:
    rng = np.random.default_rng(0)
    from gguf import GGMLQuantizationType, dequantize

    for qtype in ("Q4_K", "Q6_K", "Q8_0"):
        blocks = random_blocks(rng, (64, 512), qtype)
        std = dequantize(blocks, GGMLQuantizationType[qtype]).std()
        assert 0.015 < std < 0.025, (qtype, std)
