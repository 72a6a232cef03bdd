"""A mixture-of-experts layer's routed feed-forward as one kernel call (kernels/experts.c):
it routes as softmax-top-k does and computes what each expert's own products compute, for
every form a CPU node holds experts in (4-bit groups, GGUF blocks, gate and up of two types,
per-row int8); a row gets the same bits in any batch and on any number of threads; a layer
whose matrices do not all run on the kernels keeps torch's path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.block_bytes import random_blocks
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.packed import Matrices, PackedTensor
from swarm.runtime.weights.quant import Weight, linear
from swarm.runtime.weights.routed import ExpertBiases, ExpertRouting, NativeExperts

pytestmark = pytest.mark.skipif(
    not native.available(), reason="swarm's kernels are not built for this CPU"
)
HIDDEN, INNER, EXPERTS, TOP_K = 256, 256, 6, 2


def _packed(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> PackedTensor:
    raw = random_blocks(rng, rows * cols // ggml.BLOCKS[qtype].elements, qtype, (0.02, 0.05))
    return PackedTensor(qtype, torch.from_numpy(raw.reshape(rows, -1)), cols)


def _layer(
    gate: str, up: str, down: str, seed: int = 0
) -> tuple[Weight, list[Weight], list[Weight]]:
    """A router and EXPERTS experts whose gate, up and down are random blocks of those types."""
    rng = np.random.default_rng(seed)
    matrices = Matrices(torch.device("cpu"))
    gate_up = [
        matrices.fused([_packed(gate, INNER, HIDDEN, rng), _packed(up, INNER, HIDDEN, rng)])
        for _ in range(EXPERTS)
    ]
    downs = [matrices.fused([_packed(down, HIDDEN, INNER, rng)]) for _ in range(EXPERTS)]
    router = torch.from_numpy(rng.standard_normal((EXPERTS, HIDDEN)).astype(np.float32)) * 0.1
    return router, gate_up, downs


def _reference(
    router: Weight, gate_up: list[Weight], down: list[Weight], x: torch.Tensor, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step as torch computes it from the same matrices' own products."""
    probs = F.softmax(linear(x, router), dim=-1)
    top, chosen = torch.topk(probs, TOP_K, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for row in range(x.shape[0]):
        for e in sorted(chosen[row].tolist()):
            g, u = linear(x[row : row + 1], gate_up[e]).chunk(2, dim=-1)
            weight = top[row, chosen[row].tolist().index(e)]
            out[row] += linear(F.silu(g) * u, down[e])[0] * weight
    return out, chosen


@pytest.mark.parametrize(
    ("gate", "up", "down"),
    [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q8_0", "Q8_0"), ("Q4_K", "Q5_K", "Q4_0")],
)
@pytest.mark.parametrize("normalize", [True, False])
def test_the_call_computes_what_each_experts_products_compute(
    gate: str, up: str, down: str, normalize: bool
) -> None:
    router, gate_up, downs = _layer(gate, up, down)
    experts = NativeExperts.build(router, gate_up, downs, ExpertRouting(TOP_K, normalize))
    assert experts is not None
    x = torch.randn(9, HIDDEN)
    out, chosen = experts(x)
    want, want_chosen = _reference(router, gate_up, downs, x, normalize)
    assert [sorted(r) for r in chosen.tolist()] == [sorted(r) for r in want_chosen.tolist()]
    # the same products; silu's exponential and the router's sums round apart from torch's
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


def test_int8_experts_run_in_the_call() -> None:
    """--dtype int8: float experts as per-row int8, the router kept float."""
    rng = torch.Generator().manual_seed(3)
    matrices = Matrices(torch.device("cpu"), int8=True)
    gate_up = [matrices.fused([torch.randn(2 * INNER, HIDDEN, generator=rng)]) for _ in range(4)]
    downs = [matrices.fused([torch.randn(HIDDEN, INNER, generator=rng)]) for _ in range(4)]
    router = torch.randn(4, HIDDEN, generator=rng)
    experts = NativeExperts.build(router, gate_up, downs, ExpertRouting(TOP_K, True))
    assert experts is not None
    x = torch.randn(3, HIDDEN, generator=rng)
    out, _ = experts(x)
    # the reference in _reference's form, at four experts
    probs = F.softmax(x @ router.T, dim=-1)
    top, chosen = torch.topk(probs, TOP_K, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    for row in range(3):
        want = torch.zeros(HIDDEN)
        for e in sorted(chosen[row].tolist()):
            g, u = linear(x[row : row + 1], gate_up[e]).chunk(2, dim=-1)
            share = top[row, chosen[row].tolist().index(e)]
            want += linear(F.silu(g) * u, downs[e])[0] * share
        torch.testing.assert_close(out[row], want, rtol=1e-4, atol=1e-4)


def test_a_row_gets_its_bits_in_any_batch_and_on_any_threads() -> None:
    router, gate_up, downs = _layer("Q4_K", "Q4_K", "Q6_K", seed=1)
    experts = NativeExperts.build(router, gate_up, downs, ExpertRouting(TOP_K, True))
    assert experts is not None
    x = torch.randn(12, HIDDEN)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together, chosen = experts(x)
        torch.set_num_threads(1)
        for row in range(x.shape[0]):
            alone, alone_chosen = experts(x[row : row + 1])
            assert torch.equal(alone[0], together[row]), row
            assert torch.equal(alone_chosen[0], chosen[row])
    finally:
        torch.set_num_threads(threads)


def test_a_layer_not_all_on_the_kernels_keeps_torchs_path() -> None:
    router, gate_up, downs = _layer("Q8_0", "Q8_0", "Q8_0")
    floats = [torch.randn(HIDDEN, INNER) for _ in downs]  # a float down matrix
    assert NativeExperts.build(router, gate_up, floats, ExpertRouting(TOP_K, True)) is None
    assert isinstance(router, torch.Tensor)
    half_router = router.to(torch.bfloat16)
    assert NativeExperts.build(half_router, gate_up, downs, ExpertRouting(TOP_K, True)) is None


def test_gpt_oss_routing_clamped_glu_and_biases() -> None:
    """gpt-oss: the router's bias, the top k logits then a softmax over them, gate and up
    with their biases, (clamp(up) + 1) * g * sigmoid(alpha g) with g = min(gate, limit), down
    with its bias."""
    router, gate_up, downs = _layer("MXFP4", "MXFP4", "MXFP4", seed=4)
    g = torch.Generator().manual_seed(4)
    biases = ExpertBiases(
        router=torch.randn(EXPERTS, generator=g),
        gate_up=[torch.randn(2 * INNER, generator=g) for _ in range(EXPERTS)],
        down=[torch.randn(HIDDEN, generator=g) for _ in range(EXPERTS)],
    )
    alpha, limit = 1.702, 0.5  # a limit that clamps most gates and ups here
    routing = ExpertRouting(
        TOP_K, normalize=False, softmax_first=False, clamped=True, alpha=alpha, limit=limit
    )
    experts = NativeExperts.build(router, gate_up, downs, routing, biases)
    assert experts is not None
    x = torch.randn(5, HIDDEN, generator=g)
    out, chosen = experts(x)
    top, want_chosen = torch.topk(linear(x, router, biases.router), TOP_K, dim=-1)
    shares = F.softmax(top, dim=-1)
    assert chosen.tolist() == want_chosen.tolist()
    for row in range(x.shape[0]):
        want = torch.zeros(HIDDEN)
        for e in sorted(chosen[row].tolist()):
            both = linear(x[row : row + 1], gate_up[e], biases.gate_up[e])
            gate, up = both.chunk(2, dim=-1)
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            h = (up + 1) * gate * torch.sigmoid(gate * alpha)
            share = shares[row, chosen[row].tolist().index(e)]
            want += linear(h, downs[e], biases.down[e])[0] * share
        torch.testing.assert_close(out[row], want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
