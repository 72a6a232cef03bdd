"""llama.cpp timed in its own process: its OpenMP threads and torch's in one process throttle
each other (decode ran ~50x slower in-process here). Never imports torch. Reads lines on stdin:

* `TOKENS id,id,...`: greedy generation; answers `prefill_s decode_tok_s generated`
* `score STEPS id,id,...`: the whole sequence in one pass; answers the top-1 next token at each
  of the last STEPS positions before the end (teacher forcing: position i is judged on the
  sequence's own prefix), space-separated

    python -m bench.llama_cpp_worker MODEL.gguf THREADS [score]

`score` keeps the logits of every position (`logits_all`), which `score` lines need and which
slows prefill, so speed is measured by a worker started without it.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def load(path: str, threads: int, logits_all: bool) -> Any:
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
            path,
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=512,
            logits_all=logits_all,
            verbose=False,
        )
    finally:
        module.llama_cpp.llama_model_default_params = default


def run(llm: Any, ids: list[int], tokens: int) -> tuple[float, float, int]:
    llm.reset()  # else generate() reuses the cached prefix of the last run: no prefill
    start = time.perf_counter()
    stamps: list[float] = []
    for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == tokens:
            break
    return stamps[0] - start, (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def score(llm: Any, ids: list[int], steps: int) -> list[int]:
    llm.reset()
    llm.eval(ids)
    scores = llm.scores[: len(ids)]  # row p: the logits after ids[: p + 1]
    return [int(row.argmax()) for row in scores[len(ids) - steps - 1 : len(ids) - 1]]


def main() -> None:
    llm = load(sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["score"])
    print("ready", flush=True)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "score":
            steps, ids = int(rest[0]), [int(i) for i in rest[1].split(",")]
            print(" ".join(map(str, score(llm, ids, steps))), flush=True)
            continue
        prefill, rate, produced = run(llm, [int(i) for i in rest[0].split(",")], int(command))
        print(f"{prefill} {rate} {produced}", flush=True)


if __name__ == "__main__":
    main()
