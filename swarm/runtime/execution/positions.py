"""Per-step position data for a span of layers: rotary cos/sin for each table the layers use,
and an attention mask for each window, each computed once per step and shared by the layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.runtime.families import AttentionKind, Family

CosSin = tuple[torch.Tensor, torch.Tensor]
# positions whose decode rows a table keeps (2 x head_dim values each): 8 MiB at head_dim 64
_KEPT_POSITIONS = 16384


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
        self._rows: dict[tuple[str, torch.dtype, torch.device], _KeptRows] = {}

    def __call__(self, hidden: torch.Tensor, position_ids: torch.Tensor, table: str) -> CosSin:
        if self._per_type:
            out = self._module(hidden, position_ids, table)
        else:
            out = self._module(hidden, position_ids)
        return out[0], out[1]

    def rows(self, hidden: torch.Tensor, positions: Sequence[int], table: str) -> CosSin:
        """cos and sin [rows, 1, head_dim] for decode rows, one position each: each row what
        a call for its position alone gives, kept per position once computed. A decode step
        then costs a slice, not the rotary module's dozen tensor operations, which a hop pays
        with cold caches. Exact because every table the families take (`rope_types`) is a
        function of the position alone (no dynamic scaling)."""
        key = (table, hidden.dtype, hidden.device)
        kept = self._rows.get(key)
        if kept is None:
            kept = self._rows[key] = _KeptRows()
        if max(positions) >= _KEPT_POSITIONS:  # past what is kept: computed as before
            ids = torch.tensor(positions, device=hidden.device).view(-1, 1)
            return self(hidden, ids, table)
        for position in positions:
            if not kept.has(position):
                ids = torch.tensor([[position]], device=hidden.device)
                kept.put(position, *self(hidden[:1], ids, table))
        return kept.take(positions)


@dataclass
class _KeptRows:
    """Rows of cos and sin by position, grown as positions come (the rows a table kept)."""

    cos: torch.Tensor | None = None  # [capacity, 1, head_dim]
    sin: torch.Tensor | None = None
    filled: bytearray = field(default_factory=bytearray)

    def has(self, position: int) -> bool:
        return position < len(self.filled) and bool(self.filled[position])

    def put(self, position: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Keep one position's rows, cos and sin [1, 1, head_dim]."""
        if self.cos is None or self.sin is None or position >= self.cos.shape[0]:
            size = min(_KEPT_POSITIONS, max(256, 2 * (position + 1)))
            self.cos, self.sin = self._grown(self.cos, cos, size), self._grown(self.sin, sin, size)
            self.filled.extend(bytes(size - len(self.filled)))
        self.cos[position] = cos[0]
        self.sin[position] = sin[0]
        self.filled[position] = 1

    @staticmethod
    def _grown(old: torch.Tensor | None, row: torch.Tensor, size: int) -> torch.Tensor:
        new = torch.empty((size, *row.shape[1:]), dtype=row.dtype, device=row.device)
        if old is not None:
            new[: old.shape[0]] = old
        return new

    def take(self, positions: Sequence[int]) -> CosSin:
        assert self.cos is not None and self.sin is not None  # put() ran for each position
        if len(positions) == 1:
            at = positions[0]
            return self.cos[at : at + 1], self.sin[at : at + 1]
        ids = torch.tensor(positions, device=self.cos.device)
        return self.cos.index_select(0, ids), self.sin.index_select(0, ids)


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

    @classmethod
    def for_rows(
        cls,
        rotary: Rotary,
        kinds: list[AttentionKind],
        hidden: torch.Tensor,  # [rows, 1, hidden]
        positions: Sequence[int],  # each row's
    ) -> StepInputs:
        """Rows of one position each, no masks (every row sees every key)."""
        inputs = cls.__new__(cls)
        inputs.cos_sin = {
            rope: rotary.rows(hidden, positions, rope) for rope in {k.rope for k in kinds}
        }
        inputs.masks = dict.fromkeys({k.window for k in kinds})
        return inputs

    def for_layer(self, kind: AttentionKind) -> tuple[CosSin, torch.Tensor | None]:
        return self.cos_sin[kind.rope], self.masks[kind.window]
