"""A decode row's rotary cos and sin, kept per position (`Rotary.rows`), are the bits the
rotary module gives for that position alone and for the rows of a batched call, in every
family's tables (Llama-3 scaling, Gemma-3's two tables, gpt-oss's yarn)."""

from __future__ import annotations

import pytest
import torch

from harness.family_models import SPECS, build_model
from swarm.runtime.execution import positions
from swarm.runtime.execution.positions import Rotary
from swarm.runtime.families import family_for


@pytest.mark.parametrize("name", sorted(SPECS))
@torch.inference_mode()
def test_kept_rows_are_the_module_s_bits(name: str) -> None:
    model = build_model(SPECS[name])
    family = family_for(model.config)
    rotary = Rotary(family, model.config, model, torch.device("cpu"))
    hidden = torch.zeros(3, 1, model.config.hidden_size)
    per_type = family.rotary_per_layer_type
    for table in sorted(set(model.config.layer_types)) if per_type else ["default"]:
        for position in (0, 1, 7, 255, 256, 300, 1000, 299):  # growing, then from the kept
            cos, sin = rotary.rows(hidden[:1], [position], table)
            alone = rotary(hidden[:1], torch.tensor([[position]]), table)
            assert torch.equal(cos, alone[0]) and torch.equal(sin, alone[1])
        rows = [5, 700, 6]
        cos, sin = rotary.rows(hidden, rows, table)
        batched = rotary(hidden, torch.tensor(rows).view(-1, 1), table)
        assert cos.shape == batched[0].shape == (3, 1, batched[0].shape[-1])
        assert torch.equal(cos, batched[0]) and torch.equal(sin, batched[1])


@torch.inference_mode()
def test_positions_past_the_kept_ones_are_computed_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(positions, "_KEPT_POSITIONS", 16)
    model = build_model(SPECS["llama"])
    rotary = Rotary(family_for(model.config), model.config, model, torch.device("cpu"))
    hidden = torch.zeros(2, 1, model.config.hidden_size)
    cos, sin = rotary.rows(hidden, [3, 40], "default")
    expected = rotary(hidden, torch.tensor([[3], [40]]), "default")
    assert torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])
    cos, _ = rotary.rows(hidden[:1], [15], "default")
    assert torch.equal(cos, rotary(hidden[:1], torch.tensor([[15]]), "default")[0])
