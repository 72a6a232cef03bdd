"""swarm's compiled CPU kernels (swarm/runtime/weights/kernels/), called through their Python
module.

They multiply float activations by 4-bit weights in groups of 32 (Q4_0, Q4_1, Q4_K) or by
per-row int8 weights (Q8_0, Q5_K, Q6_K after requantization, and --dtype int8) with AVX2
integer multiply-adds, or AVX-512 VNNI ones where the CPU has them (the same bits; see
products_wide.c). Each activation enters rounded to int16 per group of 32 (~16 bits kept,
where torch's kernels take bfloat16's 8, llama.cpp's int8). On this machine even a decode
step's products are bound more by those multiplies than by reading the weights: the embedded
model's matrices take 6.3 ms per token held in cache against 7.2 ms streamed from memory.
Beside them, a layer's RMS norm and rotary embedding run as one call each (`rms_norm`,
`rotate_`) instead of five and six torch ops, and a decode step's attention for all its
sessions as one call per layer (`decode_attention`), and a mixture-of-experts layer's router
and routed experts as one call (`routed_experts`, through `weights.routed`). A Llama-shaped
layer's decode step runs whole as one call (`dense_decode`: the same kernels in the same
order, so the bits of its steps), which keeps ~100 interpreter calls a layer off a decode
step: more than the arithmetic at small widths, and more again in a hop whose interpreter
went cold while the other hops computed. They are built
at install time where a C compiler is present and used only on CPUs with AVX2, which they are
compiled for.
`available()` says whether this node runs them; where it does not, the runtime falls back to
torch's kernels and ops. `configure(KernelSwitches(...))` turns them, their AVX-512 rows or the
decode attention off (a node from `runtime.native_kernels`, `runtime.avx512_kernels` and
`runtime.native_attention`), so that a benchmark can measure both on one machine.

Nodes of one swarm should agree on this: the two paths round differently, so greedy text
through a mixed swarm can differ from one process on near ties."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from swarm.errors import ModelError

GROUP = 32  # activations share one int16 step per this many columns; cols must be a multiple


@dataclass(frozen=True)
class KernelSwitches:
    """Which of the compiled kernels run, where the CPU and the build allow them."""

    native: bool = True  # swarm's products, norms and rotary; off: torch's kernels and ops
    avx512: bool = True  # the products' AVX-512 VNNI rows (the same bits as the AVX2 ones)
    native_attention: bool = True  # a decode step's attention as one call per layer
    # a decode step through a whole Llama-shaped layer as one call (the same bits as its steps)
    dense_layers: bool = True


_switches = KernelSwitches()


def configure(switches: KernelSwitches) -> None:
    """Set the switches for what is built from now on (a matrix or a layer picks its kernel
    when it is built; the composition root calls this from the runtime config)."""
    global _switches
    if switches != _switches:
        _switches = switches
        _module.cache_clear()


def switches() -> KernelSwitches:
    return _switches


@contextlib.contextmanager
def switched(changed: KernelSwitches) -> Iterator[None]:
    """Build with `changed` inside the block, then with what was set before (benchmarks and
    tests compare both paths in one process)."""
    before = _switches
    configure(changed)
    try:
        yield
    finally:
        configure(before)


@functools.cache
def _module() -> ModuleType | None:
    if not _switches.native:
        return None
    # checked before the import: the module's code is compiled for AVX2, FMA and F16C
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from swarm.runtime.weights import _kernels  # type: ignore[attr-defined]
    except ImportError:  # not built here (no compiler at install time, or another CPU)
        return None
    module: ModuleType = _kernels
    module.use_wide(_switches.avx512)
    return module


def available() -> bool:
    return _module() is not None


def kernel_name() -> str:
    """What runs this node's 4-bit and int8 products, for status and benchmarks."""
    module = _module()
    if module is None:
        return "torch"
    return "swarm (AVX-512 VNNI)" if module.wide() else "swarm (AVX2)"


def use_wide(wanted: bool) -> bool:
    """Run the products' AVX-512 VNNI rows where this CPU has them, or their AVX2 rows (the
    same bits either way); returns whether the AVX-512 ones now run."""
    return bool(_kernels().use_wide(wanted))


def _kernels() -> ModuleType:
    module = _module()
    if module is None:
        raise ModelError("swarm's CPU kernels are not available on this node")
    return module


def _product(
    kernel: Callable[..., None],
    weights: Sequence[torch.Tensor],
    rows: int,
    cols: int,
    x: torch.Tensor,
) -> torch.Tensor:
    if x.shape[-1] != cols:  # the kernel would read past the activations
        raise ModelError(f"activations of width {x.shape[-1]} for a matrix of width {cols}")
    if x.dtype != torch.float32 or not x.is_contiguous():  # a decode step's already is
        x = x.to(torch.float32).contiguous()
    out = torch.empty((*x.shape[:-1], rows), dtype=torch.float32)
    kernel(
        *[w.data_ptr() for w in weights],
        x.data_ptr(),
        out.data_ptr(),
        rows,
        cols,
        x.numel() // cols,
        torch.get_num_threads(),
    )
    return out


def _rows_cols(values: torch.Tensor, per_byte: int) -> tuple[int, int]:
    return int(values.shape[0]), int(values.shape[1]) * per_byte


def q4_matmul(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """x [..., cols] @ w.T -> [..., rows] float32, w from 4-bit codes two per byte
    ([rows, cols / 2]) and a float16 scale and offset per group of 32 ([rows, cols / 32])."""
    return _product(_kernels().q4_matmul, [codes, scale, offset], *_rows_cols(codes, 2), x)


def i8_matmul(values: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x [..., cols] @ (values * scale[:, None]).T -> [..., rows] float32; values int8
    [rows, cols], scale float32 [rows]."""
    return _product(_kernels().i8_matmul, [values, scale], *_rows_cols(values, 1), x)


@functools.cache
def block_kinds() -> dict[str, int]:
    """GGUF block type -> its number in the block kernels (blocks.c), for the types they run."""
    return {name: i for i, name in enumerate(_kernels().block_types())}


def block_matmul(
    qtype: str, blocks: torch.Tensor, grid: torch.Tensor | None, cols: int, x: torch.Tensor
) -> torch.Tensor:
    """x [..., cols] @ w.T -> [..., rows] float32, w GGUF blocks of `qtype` as stored (uint8
    [rows, row bytes], contiguous on the CPU); grid: the type's int8 grid, for the IQ types."""
    kind = block_kinds()[qtype]
    rows = int(blocks.shape[0])

    def kernel(data: int, x_at: int, y_at: int, *sizes: int) -> None:
        _kernels().block_matmul(
            kind, data, 0 if grid is None else grid.data_ptr(), x_at, y_at, *sizes
        )

    return _product(kernel, [blocks], rows, cols, x)


# the forms of a matrix `describe_matrix` takes besides a block kind (kernels.h)
MATRIX_Q4, MATRIX_I8, MATRIX_F32 = -1, -2, -3


def describe_matrix(
    kind: int, tensors: Sequence[torch.Tensor | None], rows: int, cols: int
) -> bytes:
    """One matrix as `routed_experts` takes it: its kind (MATRIX_* or a block kind) and up to
    three tensors (see kernels.h); the caller keeps the tensors alive while it is used."""
    addresses = [0 if t is None else t.data_ptr() for t in tensors]
    addresses += [0] * (3 - len(addresses))
    described: bytes = _kernels().matrix(kind, *addresses, rows, cols)
    return described


def describe_expert(
    gate_up: Sequence[bytes],
    down: bytes,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> bytes:
    """One expert of `routed_experts`' table: gate and up (1 or 2 matrices whose rows follow
    each other), then down, and their float32 biases where the family has them."""
    biases = [0 if b is None else b.data_ptr() for b in (gate_up_bias, down_bias)]
    described: bytes = _kernels().expert(down, *biases, *gate_up)
    return described


# how `describe_layer` routes (kernels.h): softmax over every expert then the top k, or the
# top k logits then a softmax over those; and what an expert computes between its products
ROUTE_SOFTMAX_TOP_K, ROUTE_TOP_K_SOFTMAX = 0, 1
GLU_SILU, GLU_CLAMPED = 0, 1


@dataclass(frozen=True)
class ExpertLayerShape:
    experts: int
    top_k: int
    hidden: int
    inner: int
    routing: int  # ROUTE_*
    normalize: bool  # the top k's weights rescaled to sum to 1
    glu: int  # GLU_*
    alpha: float = 0.0  # GLU_CLAMPED's sigmoid slope and clamp
    limit: float = 0.0


def describe_layer(
    router: bytes, router_bias: torch.Tensor | None, shape: ExpertLayerShape
) -> bytes:
    """How `routed_experts` routes and computes a layer: its router (a described matrix) and
    float32 bias, and `shape`."""
    described: bytes = _kernels().expert_layer(
        router,
        0 if router_bias is None else router_bias.data_ptr(),
        shape.experts,
        shape.top_k,
        shape.hidden,
        shape.inner,
        shape.routing,
        int(shape.normalize),
        shape.glu,
        shape.alpha,
        shape.limit,
    )
    return described


def routed_experts(
    layer: bytes, table: bytes, top_k: int, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts feed-forward of rows x [rows, hidden] (contiguous float32): each
    row's top k experts as `layer` routes, and each chosen expert's down(glu(gate_up x)) times
    its weight, summed in ascending expert order. Returns the output [rows, hidden] and the
    chosen experts [rows, top_k] (int32)."""
    rows, hidden = x.shape
    out = torch.empty(rows, hidden, dtype=torch.float32)
    chosen = torch.empty(rows, top_k, dtype=torch.int32)
    _kernels().routed_experts(
        layer, table, x.data_ptr(), rows, out.data_ptr(), chosen.data_ptr(), torch.get_num_threads()
    )
    return out, chosen


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension; x and weight float32."""
    width = int(weight.shape[0])
    flat = x.contiguous()
    out = torch.empty_like(flat)
    _kernels().rms_norm(
        flat.data_ptr(), weight.data_ptr(), out.data_ptr(), flat.numel() // width, width, eps
    )
    return out


def rms_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """`rms_norm` in place on float32 x, rows of the weight's width (a row is read whole
    before it is written): a slice of a larger tensor, such as a position's query heads."""
    if not x.is_contiguous():
        x.copy_(rms_norm(x, weight, eps))
        return
    width = int(weight.shape[0])
    _kernels().rms_norm(
        x.data_ptr(), weight.data_ptr(), x.data_ptr(), x.numel() // width, width, eps
    )


def decode_attention_wanted() -> bool:
    """Whether layers built now take decode attention from `decode_attention` (switched off,
    torch's, so that a benchmark can measure both)."""
    return available() and _switches.native_attention


def decode_attention(
    heads: torch.Tensor,
    slots: Sequence[tuple[int, int, int, int]],
    q_heads: int,
    kv_heads: int,
    scale: float,
) -> torch.Tensor:
    """One decode position per session: heads [sessions, 1, q_heads + 2 kv_heads, head_dim]
    (rotated queries and keys, then values; contiguous float32), and per session the
    (keys address, values address, position, capacity) of its float32 cache for this layer,
    each [kv_heads, capacity, head_dim]. Writes each new key and value at its position and
    returns the attention over positions 0..position, [sessions, 1, q_heads * head_dim]."""
    sessions, seq, per_session, head_dim = heads.shape
    if (
        seq != 1
        or per_session != q_heads + 2 * kv_heads
        or q_heads % kv_heads
        or sessions != len(slots)
    ):
        raise ModelError(f"decode attention of heads {tuple(heads.shape)} for {len(slots)} caches")
    if not heads.is_contiguous() or heads.dtype != torch.float32:
        raise ModelError("decode attention needs contiguous float32 heads")
    out = torch.empty(sessions, 1, q_heads * head_dim, dtype=torch.float32)
    flat = [value for slot in slots for value in slot]
    _kernels().decode_attention(
        heads.data_ptr(), out.data_ptr(), q_heads, kv_heads, head_dim, scale, *flat
    )
    return out


def rotate_(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated: int) -> None:
    """Rotary embedding, in place, on the first `rotated` heads of contiguous float32
    heads [batch, seq, heads, head_dim]; cos and sin [batch, seq, head_dim]."""
    batch, seq, per_position, head_dim = heads.shape
    if not heads.is_contiguous():
        raise ModelError("rotary embedding in place needs contiguous heads")
    cos = cos.expand(batch, seq, head_dim).contiguous()  # one table for a batch: shared
    sin = sin.expand(batch, seq, head_dim).contiguous()
    _kernels().rotate(
        heads.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        batch * seq,
        per_position,
        rotated,
        head_dim,
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of float32 gate_up [..., 2 inner] (gate, then up): the arithmetic
    `dense_decode` uses, so that a layer run step by step gets its bits."""
    inner = int(gate_up.shape[-1]) // 2
    flat = gate_up.contiguous()
    out = torch.empty((*gate_up.shape[:-1], inner), dtype=torch.float32)
    _kernels().silu_mul(flat.data_ptr(), out.data_ptr(), flat.numel() // (2 * inner), inner)
    return out


def dense_layers_wanted() -> bool:
    """Whether Llama-shaped layers built now run a decode step as one `dense_decode` call."""
    return decode_attention_wanted() and _switches.dense_layers


@dataclass(frozen=True)
class DenseLayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inner: int
    eps: float
    scale: float


def describe_dense_layer(
    stacks: Sequence[Sequence[bytes]],
    vectors: Sequence[torch.Tensor | None],
    shape: DenseLayerShape,
    experts: tuple[bytes, bytes] | None = None,
) -> bytes:
    """A Llama-shaped layer as `dense_decode` takes it: its q/k/v, o, gate/up and down
    matrices (each 1 to 3 `describe_matrix` parts whose rows follow each other; gate/up and
    down none where `experts`, a `describe_layer` and its table of `describe_expert`s, route
    instead), then its input and post-attention norms, q/k/v and o biases and q and k norms
    (contiguous float32, or None), and `shape`. The caller keeps every tensor and both
    descriptions of `experts` alive while it is used."""
    addresses = [0 if v is None else v.data_ptr() for v in vectors]
    layer, table = experts if experts is not None else (None, None)
    described: bytes = _kernels().dense_layer(
        *[b"".join(parts) for parts in stacks],
        layer,
        table,
        *addresses,
        shape.hidden,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        shape.inner,
        shape.eps,
        shape.scale,
    )
    return described


def dense_decode(
    layer: bytes,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: Sequence[tuple[int, int, int, int]],
    chosen: torch.Tensor | None = None,
) -> None:
    """One decode position per row of contiguous float32 hidden [rows, width] through the
    described layer, in place: cos and sin [rows, head_dim] (contiguous float32), per row its
    cache's slot as `decode_attention` takes it, and where the layer routes to experts, chosen
    (int32 [rows, top_k]) for the experts each row took."""
    rows = int(hidden.shape[0])
    if len(slots) != rows or not hidden.is_contiguous() or hidden.dtype != torch.float32:
        raise ModelError(f"a dense decode of {tuple(hidden.shape)} for {len(slots)} caches")
    flat = [value for slot in slots for value in slot]
    _kernels().dense_decode(
        layer,
        hidden.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        0 if chosen is None else chosen.data_ptr(),
        rows,
        torch.get_num_threads(),
        *flat,
    )
