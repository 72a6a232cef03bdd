"""llama.cpp timed in its own process: its OpenMP threads and torch's in one process throttle
each other (decode ran ~50x slower in-process here). Reads `tokens id,id,...` lines on stdin,
answers `prefill_s decode_tok_s generated` lines; never imports torch.

    python -m bench.llama_cpp_worker MODEL.gguf THREADS
"""

from __future__ import annotations

import sys
import time
from typing import Any


def load(path: str, threads: int) -> Any:
    """Without llama.cpp's extra buffer types (weight repacking): its AMX kernels fault with a
    general protection error on VMs whose CPU flags show AMX but whose kernel does not enable
    it, as on this project's machines. Plain AVX-512 kernels remain."""
    import llama_cpp
    from llama_cpp import llama as module

    default = llama_cpp.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    module.llama_cpp.llama_model_default_params = params
    try:
        return module.Llama(
            path, n_threads=threads, n_threads_batch=threads, n_ctx=512, verbose=False
        )
    finally:
        module.llama_cpp.llama_model_default_params = default


def run(llm: Any, ids: list[int], tokens: int) -> tuple[float, float, int]:
    start = time.perf_counter()
    stamps: list[float] = []
    for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == tokens:
            break
    return stamps[0] - start, (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def main() -> None:
    llm = load(sys.argv[1], int(sys.argv[2]))
    print("ready", flush=True)
    for line in sys.stdin:
        count, ids = line.split()
        prefill, rate, produced = run(llm, [int(i) for i in ids.split(",")], int(count))
        print(f"{prefill} {rate} {produced}", flush=True)


if __name__ == "__main__":
    main()
