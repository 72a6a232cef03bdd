"""A mixture-of-experts layer's routed feed-forward on swarm's kernels: one call per layer
(`native.routed_experts`) for the router, the top k and every chosen expert's products,
where each of those matrices runs on the kernels.

Built once per layer: each matrix described as the kernels take it (its kind and the
addresses of its tensors), which this object keeps alive with the matrices themselves."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarm.runtime.weights import native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.packed import NativeQ4Matrix, StackedMatrix
from swarm.runtime.weights.quant import Int8Weight, Weight


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
        scales = weight._native_scales
        return [native.describe_matrix(native.MATRIX_I8, [weight.values, scales], rows, cols)]
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


class NativeExperts:
    """Router, gate/up and down of every expert of one layer, for `native.routed_experts`."""

    rows_alone = True  # every row routed and computed alone (experts.c)

    def __init__(
        self,
        router: bytes,
        table: bytes,
        kept: Sequence[Weight],
        top_k: int,
        normalize: bool,
        inner: int,
    ) -> None:
        self._router, self._table, self._kept = router, table, list(kept)
        self.experts = (len(kept) - 1) // 2  # the router, then a gate/up and a down each
        self.top_k, self.normalize, self.inner = top_k, normalize, inner

    @classmethod
    def build(
        cls,
        router: Weight,
        gate_up: Sequence[Weight],
        down: Sequence[Weight],
        top_k: int,
        normalize: bool,
    ) -> NativeExperts | None:
        """The layer on the kernels, or None where a matrix of it does not run on them (the
        caller keeps torch's path)."""
        if not native.available():
            return None
        described_router = describe_router(router)
        if described_router is None:
            return None
        entries = []
        for pair, out in zip(gate_up, down, strict=True):
            parts, last = describe(pair), describe(out)
            if parts is None or last is None or len(parts) > 2 or len(last) != 1:
                return None
            entries.append(native.describe_expert(parts, last[0]))
        inner = int(down[0].shape[1])
        if any(int(w.shape[0]) != 2 * inner for w in gate_up) or int(router.shape[0]) != len(down):
            return None  # not the shapes the kernel assumes: torch's path says what is wrong
        kept = [*gate_up, *down]
        return cls(described_router, b"".join(entries), [router, *kept], top_k, normalize, inner)

    def __call__(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [tokens, hidden] -> (output [tokens, hidden], chosen experts [tokens, top_k])."""
        x = rows if rows.dtype == torch.float32 else rows.to(torch.float32)
        return native.routed_experts(
            self._router,
            self._table,
            self.experts,
            self.top_k,
            self.normalize,
            x.contiguous(),
            self.inner,
        )
