"""A mixture-of-experts layer's routed feed-forward on swarm's kernels: one call per layer
(`native.routed_experts`) for the router, the top k and every chosen expert's products,
where each of those matrices runs on the kernels.

Built once per layer: each matrix described as the kernels take it (its kind and the
addresses of its tensors), which this object keeps alive with the matrices themselves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarm.runtime.weights import native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.packed import NativeQ4Matrix, StackedMatrix
from swarm.runtime.weights.quant import Int8Weight, Weight


@dataclass(frozen=True)
class ExpertRouting:
    """How a family routes and what its experts compute between their products."""

    top_k: int
    normalize: bool  # the top k's weights rescaled to sum to 1
    softmax_first: bool = True  # softmax over every expert, then the top k; else the top k
    # logits, then a softmax over those (gpt-oss)
    clamped: bool = False  # gpt-oss's SwiGLU: gate and up clamped at `limit`, slope `alpha`
    alpha: float = 0.0
    limit: float = 0.0


@dataclass(frozen=True)
class ExpertBiases:
    """gpt-oss's biases: the router's and each expert's gate/up and down."""

    router: torch.Tensor
    gate_up: Sequence[torch.Tensor]
    down: Sequence[torch.Tensor]


def describe(weight: Weight) -> list[bytes] | None:
    """A matrix as the kernels take it, one description per stacked part; None where any
    part does not run on them (a float part, torch's int4, a non-CPU device)."""
    if isinstance(weight, StackedMatrix):
        parts = [describe(p) for p in weight.parts]
        if any(p is None for p in parts):
            return None
        return [d for p in parts if p is not None for d in p]
    rows, cols = (int(n) for n in weight.shape)
    if isinstance(weight, NativeQ4Matrix):
        tensors = [weight.codes, weight.scale, weight.offset]
        return [native.describe_matrix(native.MATRIX_Q4, tensors, rows, cols)]
    if isinstance(weight, NativeBlockMatrix):
        kind = native.block_kinds()[weight.qtype]
        return [native.describe_matrix(kind, [weight.data, weight.grid], rows, cols)]
    if isinstance(weight, Int8Weight) and weight.rows_alone:
        int8 = [weight.values, weight.kernel_scales]
        return [native.describe_matrix(native.MATRIX_I8, int8, rows, cols)]
    return None


def describe_router(router: Weight) -> bytes | None:
    """The router as the kernels take it: a matrix they run, or a float32 one (a few dozen
    rows, summed in experts.c). Float experts never take that path: they keep torch's
    products, and with them transformers' exact bits."""
    if isinstance(router, torch.Tensor):
        if router.device.type != "cpu" or router.dtype != torch.float32:
            return None
        if not router.is_contiguous():  # the layer keeps this very tensor alive
            return None
        rows, cols = (int(n) for n in router.shape)
        return native.describe_matrix(native.MATRIX_F32, [router], rows, cols)
    described = describe(router)
    return described[0] if described is not None and len(described) == 1 else None


def _float32(tensors: Sequence[torch.Tensor]) -> bool:
    return all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors
    )


class NativeExperts:
    """Router, gate/up and down of every expert of one layer, for `native.routed_experts`."""

    rows_alone = True  # every row routed and computed alone (experts.c)

    def __init__(self, layer: bytes, table: bytes, top_k: int, kept: Sequence[object]) -> None:
        self._layer, self._table, self.top_k = layer, table, top_k
        self._kept = list(kept)  # what the descriptions point into

    @classmethod
    def build(
        cls,
        router: Weight,
        gate_up: Sequence[Weight],
        down: Sequence[Weight],
        routing: ExpertRouting,
        biases: ExpertBiases | None = None,
    ) -> NativeExperts | None:
        """The layer on the kernels, or None where a matrix of it does not run on them (the
        caller keeps torch's path)."""
        if not native.available():
            return None
        described_router = describe_router(router)
        if described_router is None:
            return None
        experts, inner = len(down), int(down[0].shape[1])
        hidden = int(down[0].shape[0])
        if any(int(w.shape[0]) != 2 * inner for w in gate_up) or int(router.shape[0]) != experts:
            return None  # not the shapes the kernel assumes: torch's path says what is wrong
        if biases is not None and not _float32([biases.router, *biases.gate_up, *biases.down]):
            return None
        entries = []
        for e, (pair, out) in enumerate(zip(gate_up, down, strict=True)):
            parts, last = describe(pair), describe(out)
            if parts is None or last is None or len(parts) > 2 or len(last) != 1:
                return None
            pair_bias = None if biases is None else biases.gate_up[e]
            down_bias = None if biases is None else biases.down[e]
            entries.append(native.describe_expert(parts, last[0], pair_bias, down_bias))
        shape = native.ExpertLayerShape(
            experts=experts,
            top_k=routing.top_k,
            hidden=hidden,
            inner=inner,
            routing=native.ROUTE_SOFTMAX_TOP_K
            if routing.softmax_first
            else native.ROUTE_TOP_K_SOFTMAX,
            normalize=routing.normalize,
            glu=native.GLU_CLAMPED if routing.clamped else native.GLU_SILU,
            alpha=routing.alpha,
            limit=routing.limit,
        )
        layer = native.describe_layer(
            described_router, None if biases is None else biases.router, shape
        )
        kept: list[object] = [router, *gate_up, *down, biases]
        return cls(layer, b"".join(entries), routing.top_k, kept)

    @property
    def described(self) -> tuple[bytes, bytes]:
        """The layer and its expert table as the kernels take them (`native.dense_layer`)."""
        return self._layer, self._table

    def __call__(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [tokens, hidden] -> (output [tokens, hidden], chosen experts [tokens, top_k])."""
        x = rows if rows.dtype == torch.float32 else rows.to(torch.float32)
        return native.routed_experts(self._layer, self._table, self.top_k, x.contiguous())
