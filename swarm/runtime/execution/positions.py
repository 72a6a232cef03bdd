"""Per-step position data for a span of layers: rotary cos/sin for each table the layers use,
and an attention mask for each window, each computed once per step and shared by the layers."""

from __future__ import annotations

from typing import Any

import torch

from swarm.runtime.families import AttentionKind, Family

CosSin = tuple[torch.Tensor, torch.Tensor]


def attention_mask(
    position: int, seq: int, window: int | None, device: torch.device, explicit: bool = False
) -> torch.Tensor | None:
    """bool [1, 1, seq, position + seq], True = attend: causal, and within `window` positions
    (the query's own included). None when attention's own causal flag is exact (a fresh
    prefill or a single position that sees every key), unless `explicit` (eager attention)."""
    end = position + seq
    sees_all = window is None or end <= window
    if sees_all and not explicit and (position == 0 or seq == 1):
        return None
    query = torch.arange(position, end, device=device).unsqueeze(1)
    key = torch.arange(end, device=device).unsqueeze(0)
    allowed = key <= query
    if window is not None:
        allowed &= key > query - window
    return allowed.view(1, 1, seq, end)


class Rotary:
    """transformers' rotary module of the family, one table per layer type where the family
    has several (Gemma-3), adjusted by the family's hook (Llama-3 GGUF frequency factors)."""

    def __init__(self, family: Family, config: Any, skeleton: torch.nn.Module, device: Any) -> None:
        rotary_class = type(skeleton.get_submodule(family.paths.rotary))
        with torch.device(device):
            self._module: torch.nn.Module = rotary_class(config=config)
        family.rotary_hook(config, self._module)
        self._per_type = family.rotary_per_layer_type

    def __call__(self, hidden: torch.Tensor, position_ids: torch.Tensor, table: str) -> CosSin:
        if self._per_type:
            out = self._module(hidden, position_ids, table)
        else:
            out = self._module(hidden, position_ids)
        return out[0], out[1]


class StepInputs:
    """What the layers of one step need besides the hidden states."""

    def __init__(
        self,
        rotary: Rotary,
        kinds: list[AttentionKind],
        hidden: torch.Tensor,  # [batch, seq, hidden]
        position_ids: torch.Tensor,  # [batch, seq]
        mask_position: int | None,  # first position of a one-session step; None: no masks
        explicit_masks: bool,
    ) -> None:
        seq = hidden.shape[1]
        # once per table and window, not per layer: most spans have one of each
        ropes = {k.rope for k in kinds}
        self.cos_sin = {rope: rotary(hidden, position_ids, rope) for rope in ropes}
        self.masks: dict[int | None, torch.Tensor | None] = {
            window: None
            if mask_position is None
            else attention_mask(mask_position, seq, window, hidden.device, explicit_masks)
            for window in {k.window for k in kinds}
        }

    def for_layer(self, kind: AttentionKind) -> tuple[CosSin, torch.Tensor | None]:
        return self.cos_sin[kind.rope], self.masks[kind.window]
