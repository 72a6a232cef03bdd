"""The part of a decoder layer after its attention, as the lean block (`llama.LlamaBlock`)
takes it: gate, up and down for a dense layer, the routed experts (`moe.SparseExperts`) for a
mixture of experts."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from swarm.runtime.weights import native
from swarm.runtime.weights.packed import Matrices, Source
from swarm.runtime.weights.quant import linear, rows_alone


class FeedForward(Protocol):
    """Normed hidden [batch, seq, hidden] to the same shape."""

    @property
    def rows_alone(self) -> bool:
        """Whether each row is computed alone, the same bits whatever the number of rows."""
        ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


MLP_WEIGHTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


class GatedMLP:
    """down(silu(gate(x)) * up(x)), gate and up as one matrix. Where the products run on
    swarm's kernels, so does silu(gate) * up (`native.silu_mul`): the arithmetic of a decode
    step through the whole layer in one call (`native.dense_decode`), which a prefill or a
    replay of the same positions must share."""

    def __init__(self, matrices: Matrices, weights: dict[str, Source]) -> None:
        gate, up, down = (weights[name] for name in MLP_WEIGHTS)
        self.gate_up = matrices.fused([gate, up])
        self.down = matrices.fused([down])
        self._native_glu = native.available() and self.rows_alone

    @property
    def rows_alone(self) -> bool:
        return rows_alone(self.gate_up) and rows_alone(self.down)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = linear(x, self.gate_up)
        if self._native_glu and gate_up.dtype == torch.float32:
            return linear(native.silu_mul(gate_up), self.down)
        gate, up = gate_up.chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.down)
