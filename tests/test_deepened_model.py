"""The deepened embedded model (harness.deepened_model): its scaled copies are the original
weights times the scale, and the file is a model of the embedded vocabulary, (copies + 1)
times as deep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.deepened_model import deepened_path, scaled_q4_1
from harness.paths import MODEL_CACHE


def test_scaled_q4_1_blocks_are_the_weights_times_the_scale() -> None:
    from gguf import GGMLQuantizationType, dequantize, quantize

    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.02, (8, 64)).astype(np.float32)
    blocks = quantize(weights, GGMLQuantizationType.Q4_1)
    original = dequantize(blocks, GGMLQuantizationType.Q4_1)
    scaled = dequantize(scaled_q4_1(blocks, 0.05), GGMLQuantizationType.Q4_1)
    assert np.allclose(scaled, 0.05 * original, rtol=1e-3, atol=2e-6)  # d and m round to fp16 apart
    assert np.array_equal(dequantize(blocks, GGMLQuantizationType.Q4_1), original)  # a copy


@pytest.mark.slow
def test_the_deepened_model_loads_with_the_embedded_vocabulary(tmp_path: Path) -> None:
    from swarm.config import RuntimeConfig
    from swarm.runtime.execution.draft_model import vocabulary_mismatch
    from swarm.runtime.execution.entry import EntryModel
    from swarm.runtime.execution.model import ModelContext

    path = deepened_path(1, 0.05, tmp_path)
    deep = ModelContext.open(RuntimeConfig(model=str(path), cache_dir=tmp_path), progress=False)
    # the embedded model from the suite's shared cache: converting it again costs ~20 s
    small = ModelContext.open(RuntimeConfig(cache_dir=MODEL_CACHE), progress=False)
    assert deep.num_layers == 2 * small.num_layers
    assert vocabulary_mismatch(EntryModel(deep), EntryModel(small)) is None
