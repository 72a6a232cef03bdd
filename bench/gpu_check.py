"""The GPU check a CUDA machine runs from a fresh checkout (bench/gpu/check.sh), with the torch
and Triton it has, in a few minutes. Three sections, each failing alone:

* correctness: every Triton kernel compiled for this GPU against the reference dequantizer
  (`swarm.runtime.weights.dequant`, run on the GPU in float32): y = x @ W.T for 1, 5, 8 and 33
  activation rows (the decode kernel, then the prefill one); the error of each output over
  sum |x| |w|, against 1e-5 (decode, float32 sums) and 1e-4 (prefill's tl.dot, tf32x3)
* timing: a stack of `--layers` Llama-7B-shaped layers (qkv, o, gate+up, down) in one block
  type, its packed products against torch float16 F.linear on the same weights dequantized:
  ms per layer for one token (plain launches and a CUDA graph) and for `--prefill` tokens
* part-GPU node: the embedded model as a node runs it, all layers on the GPU, then with a
  --gpu-memory that holds only `--gpu-layers` of them (the rest on the CPU, the hidden states
  crossing once a step), then all on the CPU: each one's greedy text, whether it matches the
  others', and its decode tokens/s
* readings: nvml's temperature, utilisation, memory, power and throttle reasons, and torch's
  memory, before and after

    bash bench/gpu/check.sh [--layers 4] [--prefill 512] [--types Q4_K,Q6_K,Q8_0,Q4_0,Q5_K]

Without a GPU, `python -m bench.gpu_check --compile-only` compiles every kernel for an H100
(sm_90, with the ptxas Triton brings) and prints what each took, and `python -m
bench.gpu_check --part-gpu-on-cpu` runs the part-GPU section with its device group on the CPU
(the stand-in the tests use).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.reference import PROMPTS, greedy
from swarm.config import RuntimeConfig
from swarm.inference.local import load_local
from swarm.runtime.execution.devices import cap_holding
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.gpu import matrix as gpu
from swarm.runtime.gpu.device import Accelerator, accelerator
from swarm.runtime.gpu.share import throttling
from swarm.runtime.weights import dequant, ggml, on_gpu

_HIDDEN, _FFN = 4096, 11008  # Llama-7B's widths (both whole numbers of 256-weight blocks)
_SHAPES = ((3 * _HIDDEN, _HIDDEN), (_HIDDEN, _HIDDEN), (2 * _FFN, _HIDDEN), (_HIDDEN, _FFN))
_BATCHES = (1, 5, 8, 33)


def random_blocks(qtype: str, rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """uint8 [rows, row bytes] of valid blocks: random codes, float16 scales in 1e-3..1e-2."""
    kind = ggml.BLOCKS[qtype]
    n = rows * cols // kind.elements
    raw = torch.randint(0, 256, (n, kind.nbytes), dtype=torch.uint8, device=device)
    d = torch.empty(n, 1, device=device).uniform_(1e-3, 1e-2)
    for at in kind.halves:
        raw[:, at : at + 2] = d.half().view(torch.uint8)
    if qtype == "MXFP4":  # an E8M0 exponent near d
        raw[:, 0] = (torch.log2(d[:, 0]).round() + 128).to(torch.uint8)
    return raw.view(rows, -1)


def _worst(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, tolerance: float) -> float:
    bound = tolerance * (x.abs() @ w.abs().T) + 1e-30
    return float(((y.float() - x @ w.T).abs() / bound).max())


def correctness(device: torch.device) -> bool:
    print("\n== correctness: compiled kernels against the reference dequantizer ==")
    print(f"{'type':8} {'x rows':>6} {'worst/tol':>10}  verdict")
    ok = True
    for qtype in sorted(gpu.KERNEL_TYPES):
        try:
            kind = ggml.BLOCKS[qtype]
            rows, cols = 300, kind.elements * (9 if kind.elements == 32 else 3)
            data = random_blocks(qtype, rows, cols, device)
            matrix = on_gpu.triton_matrix(qtype, data, cols)
            w = dequant.dequantize(qtype, data, cols)
            for batch in _BATCHES:
                x = torch.randn(batch, cols, device=device)
                tol = 1e-5 if batch <= gpu.DECODE_ROWS else 1e-4
                worst = _worst(matrix.matmul(x), x, w, tol)
                verdict = "ok" if worst <= 1.0 else "FAIL"
                ok &= worst <= 1.0
                print(f"{qtype:8} {batch:6} {worst:10.3f}  {verdict}")
        except Exception:
            ok = False
            print(f"{qtype:8} error:\n{traceback.format_exc()}")
    return ok


def _ms(run: Callable[[], object], acc: Accelerator, repeats: int) -> float:
    run()
    acc.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    acc.synchronize()
    return (time.perf_counter() - start) * 1e3 / repeats


def timing(device: torch.device, acc: Accelerator, args: argparse.Namespace) -> None:
    print(f"\n== timing: {args.layers} layers of Llama-7B's shapes, float16 activations ==")
    print(f"{'type':8} {'MB/layer':>9} {'fp16 MB':>8} {'decode ms':>10} {'graph ms':>9} "
          f"{'fp16 ms':>8} {'prefill ms':>11} {'fp16 ms':>8}")  # fmt: skip
    for qtype in args.types.split(","):
        try:
            _time_type(qtype, device, acc, args)
        except Exception:
            print(f"{qtype:8} error:\n{traceback.format_exc()}")


def _time_type(qtype: str, device: torch.device, acc: Accelerator, a: argparse.Namespace) -> None:
    packed, halves = [], []
    for _ in range(a.layers):
        for rows, cols in _SHAPES:
            data = random_blocks(qtype, rows, cols, device)
            packed.append(on_gpu.triton_matrix(qtype, data, cols))
            halves.append(dequant.dequantize(qtype, data, cols, torch.float16))
    one = torch.randn(1, _HIDDEN, device=device, dtype=torch.float16)
    many = torch.randn(a.prefill, _HIDDEN, device=device, dtype=torch.float16)
    wide_one = torch.randn(1, _FFN, device=device, dtype=torch.float16)
    wide_many = torch.randn(a.prefill, _FFN, device=device, dtype=torch.float16)

    def stack(mats: list[Callable[[torch.Tensor], torch.Tensor]], x, wide) -> torch.Tensor:
        out = x
        for i, m in enumerate(mats):
            out = m(wide if i % 4 == 3 else x)
        return out

    p = [m.matmul for m in packed]
    h: list[Callable[[torch.Tensor], torch.Tensor]] = [
        (lambda x, w=w: F.linear(x, w)) for w in halves
    ]
    decode = _ms(lambda: stack(p, one, wide_one), acc, a.repeats) / a.layers
    graph_ms = _ms(acc.replayable(lambda: stack(p, one, wide_one)), acc, a.repeats) / a.layers
    half_decode = _ms(lambda: stack(h, one, wide_one), acc, a.repeats) / a.layers
    prefill = _ms(lambda: stack(p, many, wide_many), acc, 3) / a.layers
    half_prefill = _ms(lambda: stack(h, many, wide_many), acc, 3) / a.layers
    mb = sum(m.nbytes for m in packed) / a.layers / 1e6
    half_mb = sum(int(w.nbytes) for w in halves) / a.layers / 1e6
    print(f"{qtype:8} {mb:9.1f} {half_mb:8.1f} {decode:10.3f} {graph_ms:9.3f} "
          f"{half_decode:8.3f} {prefill:11.2f} {half_prefill:8.2f}")  # fmt: skip


def readings(acc: Accelerator, when: str) -> None:
    memory, health = acc.memory(), acc.readings()
    print(
        f"\n== readings {when}: {memory.held_bytes / 2**20:.0f} MiB held by torch, "
        f"{memory.free_bytes / 2**30:.1f} of {memory.total_bytes / 2**30:.1f} GiB free; nvml: "
        f"temperature {health.gpu_temperature_c} C, utilisation {health.gpu_utilization}, "
        f"used {health.gpu_memory_used_bytes} of {health.gpu_memory_total_bytes} bytes, "
        f"power {health.gpu_power_w} W, slowed: {throttling(health) or 'no'} =="
    )


async def _decode(runtime: RuntimeConfig, tokens: int) -> tuple[str, float]:
    """The greedy answer to the first prompt through one process, and its tokens/s (a
    warm-up answer first: the kernels compile and autotune outside the timing)."""
    local = await load_local(runtime)
    try:
        ids = local.entry.encode_chat([{"role": "user", "content": PROMPTS[0]}])
        await greedy(local, ids, 2)
        start = time.perf_counter()
        answer = await greedy(local, ids, tokens)
        return answer.text, answer.completion_tokens / (time.perf_counter() - start)
    finally:
        local.compute.close()


def part_gpu(device: torch.device, gpu_layers: int, tokens: int) -> bool:
    """The embedded model all on `device`, split after `gpu_layers` layers, and all on the
    CPU: the split's text must be the all-device text (the same kernels on the same layers,
    the CPU's on the rest, as the CPU run's); both are printed beside the CPU's."""
    print(f"\n== part-GPU node: {gpu_layers} layers on {device}, the rest on the CPU ==")
    with tempfile.TemporaryDirectory() as cache:
        cpu = RuntimeConfig(cache_dir=Path(cache), threads=0)
        whole = dataclasses.replace(cpu, device=device.type)  # cuda: every layer it has room for
        context = ModelContext.open(whole, progress=False)
        cap = cap_holding(context, whole, gpu_layers, context.num_layers)
        split = dataclasses.replace(whole, gpu_memory_bytes=cap)
        runs = {}
        for name, runtime in (("all on device", whole), ("split", split), ("all on cpu", cpu)):
            if name == "all on device" and device.type == "cpu":
                continue  # the stand-in: the CPU run is the one group
            text, rate = asyncio.run(_decode(runtime, tokens))
            runs[name] = text
            print(f"{name:14} {rate:7.1f} tokens/s  {text[:60]!r}")
    reference = runs.get("all on device", runs["all on cpu"])
    same = runs["split"] == reference
    print(
        f"split text equals the one-group text: {'yes' if same else 'NO'}; "
        f"equals the CPU's: {'yes' if runs['split'] == runs['all on cpu'] else 'no'}"
    )
    return same


def compile_only() -> bool:
    from harness.gpu_compile import TILES, compile_kernel

    print("== every kernel compiled for sm_90, no GPU needed ==")
    ok = True
    for qtype in sorted(gpu.KERNEL_TYPES):
        for kernel in sorted(TILES):
            for activations in ("fp32", "fp16"):
                try:
                    out = compile_kernel(qtype, kernel, activations)
                    print(f"{qtype:8} {kernel:15} {activations}  {out.seconds:5.1f} s  "
                          f"{out.cubin_bytes} bytes of cubin")  # fmt: skip
                except Exception:
                    ok = False
                    print(f"{qtype:8} {kernel:15} {activations}  FAILED:\n{traceback.format_exc()}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_0,Q5_K")
    parser.add_argument("--skip", default="", help="sections to skip: correctness,timing,part-gpu")
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90, no GPU")
    parser.add_argument("--gpu-layers", type=int, default=12, help="of the part-GPU node's 30")
    parser.add_argument("--tokens", type=int, default=64, help="each part-GPU answer's")
    parser.add_argument(
        "--part-gpu-on-cpu", action="store_true", help="the part-GPU section on the stand-in"
    )
    args = parser.parse_args()
    if args.compile_only:
        return 0 if compile_only() else 1
    if args.part_gpu_on_cpu:
        return 0 if part_gpu(torch.device("cpu"), args.gpu_layers, args.tokens) else 1
    if not torch.cuda.is_available():
        print("no CUDA device: torch", torch.__version__, "finds none; nothing to check")
        return 2
    if not gpu.available():
        print("triton is not installed: pip install 'triton==3.9.0' (the cuda extra)")
        return 2
    import triton

    device = torch.device("cuda", torch.cuda.current_device())
    acc = accelerator(device)
    print(f"{torch.cuda.get_device_name(device)}: torch {torch.__version__}, "
          f"triton {triton.__version__}, CUDA {torch.version.cuda}")  # fmt: skip
    torch.manual_seed(0)
    ok = True
    for name, section in (
        ("readings", lambda: readings(acc, "before")),
        ("correctness", lambda: correctness(device)),
        ("timing", lambda: timing(device, acc, args)),
        ("part-gpu", lambda: part_gpu(device, args.gpu_layers, args.tokens)),
        ("readings", lambda: readings(acc, "after")),
    ):
        if name in args.skip.split(","):
            continue
        try:
            ok &= section() is not False
        except Exception:
            ok = False
            print(f"{name} failed:\n{traceback.format_exc()}")
        sys.stdout.flush()
    print("\nall sections ok" if ok else "\nSOME SECTIONS FAILED (above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
