"""The 7B-shaped fixture's mixes (`harness.fixture_7b`): each tensor's type as llama.cpp's
quantizer picks it for a Qwen2-7B-like model, shapes its types can hold, file names that keep
the Q4_K_M file's cache valid, and blocks whose weights have the intended spread. Nothing here
builds the 3-5 GB file."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from harness.fixture_7b import (
    MIXES,
    QWEN2_7B,
    QWEN25_SHAPES,
    Mix,
    file_name,
    random_tensor,
    tensor_plan,
)
from harness.gguf_fixture import WEIGHT_STD

NAMED = {
    "Q4_K_M": {
        "token_embd.weight": "Q4_K",
        "blk.0.attn_v.weight": "Q6_K",
        "blk.4.attn_v.weight": "Q4_K",
        "blk.5.ffn_down.weight": "Q6_K",
        "blk.27.ffn_down.weight": "Q6_K",
        "blk.9.attn_output.weight": "Q4_K",
        "output.weight": "Q6_K",
    },
    "Q3_K_M": {
        "token_embd.weight": "Q3_K",
        "blk.0.attn_q.weight": "Q3_K",
        "blk.1.attn_v.weight": "Q5_K",
        "blk.2.attn_v.weight": "Q4_K",
        "blk.0.ffn_down.weight": "Q5_K",
        "blk.1.ffn_down.weight": "Q4_K",
        "blk.9.attn_output.weight": "Q4_K",
        "blk.9.ffn_gate.weight": "Q3_K",
        "output.weight": "Q6_K",
    },
    "Q2_K": {
        "token_embd.weight": "Q2_K",
        "blk.0.attn_k.weight": "Q2_K",
        "blk.0.attn_v.weight": "Q4_K",
        "blk.5.attn_output.weight": "Q3_K",
        "blk.5.ffn_up.weight": "Q2_K",
        "blk.27.ffn_down.weight": "Q3_K",
        "output.weight": "Q6_K",
    },
}
# matrices per type, 1 + 7 x 28 layers + 1 in all; Q4_K_M gives 14 layers more bits
# (0-2, 24-27 and 5, 8, ..., 23)
COUNTS = {
    "Q4_K_M": {"Q4_K": 1 + 5 * 28 + 2 * 14, "Q6_K": 2 * 14 + 1},
    "Q3_K_M": {"Q3_K": 1 + 4 * 28, "Q4_K": 2 * 28 - 3 + 28, "Q5_K": 3, "Q6_K": 1},
    "Q2_K": {"Q2_K": 1 + 4 * 28, "Q3_K": 2 * 28, "Q4_K": 28, "Q6_K": 1},
}


@pytest.mark.parametrize("mix", MIXES)
def test_each_mix_types_tensors_as_llama_cpp_does(mix: Mix) -> None:
    plan = {name: qtype for name, _, qtype in tensor_plan(QWEN2_7B, mix)}
    assert {name: plan[name] for name in NAMED[mix]} == NAMED[mix]
    matrices = Counter(qtype for qtype in plan.values() if qtype != "F32")
    assert matrices == COUNTS[mix]


@pytest.mark.parametrize("size", QWEN25_SHAPES)
@pytest.mark.parametrize("mix", MIXES)
def test_every_matrix_holds_whole_blocks(mix: Mix, size: str) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, shape, qtype in tensor_plan(QWEN25_SHAPES[size], mix):
        if qtype != "F32":
            block, _ = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
            assert len(shape) == 2 and shape[1] % block == 0, (name, shape, qtype)


def test_q2_k_gives_attn_v_fewer_bits_under_4_query_heads_per_kv_head() -> None:
    spec = dataclasses.replace(QWEN2_7B, kv_heads=14)
    plan = {name: qtype for name, _, qtype in tensor_plan(spec, "Q2_K")}
    assert plan["blk.3.attn_v.weight"] == "Q3_K"


def test_the_default_mix_keeps_its_cached_file_name() -> None:
    assert file_name() == file_name(QWEN2_7B, "Q4_K_M") == "qwen2-random-28l-3584-s0-v2.gguf"
    names = {file_name(QWEN2_7B, mix) for mix in MIXES}
    assert len(names) == len(MIXES)
    assert "q3_k_m" in file_name(QWEN2_7B, "Q3_K_M") and "q2_k" in file_name(QWEN2_7B, "Q2_K")


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_random_blocks_have_the_intended_spread(qtype: str) -> None:
    from gguf import GGMLQuantizationType, dequantize

    blocks = random_tensor(np.random.default_rng(0), "m.weight", (64, 1024), qtype)
    weights = dequantize(blocks, GGMLQuantizationType[qtype])
    assert weights.shape == (64, 1024)
    assert abs(weights.std() / WEIGHT_STD - 1) < 0.05, weights.std()
    assert abs(weights.mean()) < 0.05 * WEIGHT_STD, weights.mean()


def test_a_width_of_no_whole_super_blocks_takes_llama_cpps_fallback_types() -> None:
    """0.5B's width (896) is 3.5 super-blocks: its 896-wide matrices take the 32-weight types
    llama.cpp falls back to; ffn_down (4864 wide) keeps its K-quant."""
    plan = {name: qtype for name, _, qtype in tensor_plan(QWEN25_SHAPES["0.5b"], "Q4_K_M")}
    assert plan["token_embd.weight"] == "Q5_0" and plan["output.weight"] == "Q8_0"
    assert plan["blk.0.attn_v.weight"] == "Q8_0" and plan["blk.3.attn_v.weight"] == "Q5_0"
    assert plan["blk.0.ffn_down.weight"] == "Q6_K" and plan["blk.3.ffn_down.weight"] == "Q4_K"
    q2 = {name: qtype for name, _, qtype in tensor_plan(QWEN25_SHAPES["0.5b"], "Q2_K")}
    assert q2["blk.3.ffn_gate.weight"] == "IQ4_NL"


@pytest.mark.parametrize("qtype", ["Q5_0", "Q8_0", "IQ4_NL"])
def test_fallback_blocks_have_the_intended_spread(qtype: str) -> None:
    from gguf import GGMLQuantizationType, dequantize

    blocks = random_tensor(np.random.default_rng(0), "m.weight", (64, 896), qtype)
    weights = dequantize(blocks, GGMLQuantizationType[qtype])
    assert weights.shape == (64, 896)
    assert abs(weights.std() / WEIGHT_STD - 1) < 0.1, weights.std()
