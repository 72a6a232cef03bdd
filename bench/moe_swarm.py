"""A mixture-of-experts model too big for one capped node, served by three on loopback, against
one process holding all of it: the seeded ~3 GB Qwen3-MoE of harness.moe_fixture (48 layers,
64 experts of 512, 8 routed, Q4_K_M-like), greedy, one torch thread per process.

1. three real node processes, each --layer-memory-bytes'd to 17 of the 48 layers, so none can
   hold the model: prefill ms of a ~100-token chat prompt and decode tokens/s through the
   first node's API (medians of --repeats after a warm-up run), each node's span and
   resident memory;
2. one process with the whole model: the same; its greedy text must equal the three nodes'
   (the bench fails otherwise);
3. llama.cpp (llama-cpp-python, when it imports) on the same file, one thread, in its own
   process (bench.runtime's worker): decode tokens/s and swarm's ratio to it. Where it does
   not import but llama.cpp's tools are built (`python -m bench.llama_cpp_tools`):
   llama-bench's generation figure for one process and for its RPC mode split three ways
   (the host and two `ggml-rpc-server`s on loopback, 16 layers each, one thread each), beside
   the one process and the three nodes.

What routing saves (the routed experts against every expert computed) is bench.moe_decode's.

    SWARM_TEST_CACHE=DIR python -m bench.moe_swarm [--tokens 32] [--repeats 3] [--tiny]

(the fixture and its converted parts, ~6.2 GB, go beside DIR, default the repository's .cache)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
from pathlib import Path

from bench import llama_cpp_tools
from bench.rpc_split import llama_split_rate
from bench.runtime import LlamaCpp
from bench.swarm import print_timeline
from harness.capped_swarm import Decode, capped_nodes, one_process
from harness.moe_fixture import QWEN3_MOE_3GB, QWEN3_MOE_TINY, moe_fixture_path
from harness.paths import FIXTURES, MODEL_CACHE
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext

# ~100 tokens once the chat template wraps it
PROMPT = (
    "You keep the lighthouse on a small island in the north. Every night you climb the "
    "stairs, light the lamp and write the weather in the log. One morning after a storm you "
    "find a green glass bottle in the rocks below the tower, sealed with wax, with a letter "
    "inside written in a language you almost know. Write the story of what the letter says, "
    "who sent it, and what you do next, in a calm and careful voice."
)


def _median(runs: list[Decode], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def _llama_rpc(path: Path, layers: int, tokens: int, repeats: int) -> dict[int, float] | None:
    """llama-bench's decode tokens/s for 1 and 3 processes (its RPC mode), medians."""
    tools = llama_cpp_tools.built()
    if tools is None:
        return None
    return {
        ways: statistics.median(
            llama_split_rate(tools, path, ways, tokens, layers) for _ in range(repeats)
        )
        for ways in (1, 3)
    }


def _llama_cpp(path: Path, ids: list[int], tokens: int, repeats: int) -> float | None:
    if importlib.util.find_spec("llama_cpp") is None:
        print("llama.cpp: skipped (llama-cpp-python does not import)")
        return None
    llm = LlamaCpp(path, 1)
    try:
        llm.run(ids, 4)  # warm-up
        return statistics.median(llm.run(ids, tokens)[1] for _ in range(repeats))
    finally:
        llm.close()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="the 2-layer fixture, a smoke run")
    args = parser.parse_args()
    spec = QWEN3_MOE_TINY if args.tiny else QWEN3_MOE_3GB
    path = moe_fixture_path(spec, FIXTURES)
    runtime = RuntimeConfig(model=str(path), cache_dir=MODEL_CACHE, threads=1)
    context = await asyncio.to_thread(ModelContext.open, runtime)  # converts the file once
    ids = EntryModel(context).encode_chat([{"role": "user", "content": PROMPT}])
    del context
    print(
        f"{path.name}: {path.stat().st_size / 1e9:.2f} GB, {spec.layers} layers, hidden "
        f"{spec.hidden}, {spec.experts} experts of {spec.expert_ffn}, top {spec.top_k}, "
        f"{spec.parameters() / 1e9:.2f}B parameters ({spec.active_parameters() / 1e9:.2f}B "
        f"active); prompt {len(ids)} tokens, {args.tokens} new, one torch thread per process, "
        f"medians of {args.repeats}"
    )
    # the nodes first: the whole model, once loaded here, stays resident in this process
    # (freed tensors stay in the allocator's arenas) and would sit beside the nodes' memory
    swarm, nodes, cap = await capped_nodes(runtime, PROMPT, args.tokens, 3, args.repeats + 1)
    swarm = swarm[1:]  # the first warms the caches
    alone, _ = await one_process(runtime, PROMPT, args.tokens, args.repeats + 1)
    alone = alone[1:]
    if any(r.text != alone[0].text for r in (*alone, *swarm)):
        print(f"one process: {alone[0].text!r}\nthree nodes: {swarm[0].text!r}")
        sys.exit("the three nodes' greedy text differs from the one process's")
    print(f"greedy text, equal on both ({alone[0].tokens} tokens): {alone[0].text[:80]!r}...")
    print(f"{'setup':26}{'prefill ms':>11}{'decode tok/s':>13}{'vs 1 process':>14}")
    one_rate = _median(alone, "tokens_per_s")
    for name, runs in (("1 process, whole model", alone), ("3 capped nodes", swarm)):
        rate = _median(runs, "tokens_per_s")
        prefill = _median(runs, "prefill_ms")
        print(f"{name:26}{prefill:11.0f}{rate:13.2f}{rate / one_rate:13.2f}x")
    print("where a step's time went at the three nodes:")
    print_timeline([r.timeline for r in swarm if r.timeline is not None])
    print(f"each node capped at {cap / 1e9:.2f} GB of layers (--layer-memory-bytes {cap})")
    for node in nodes:
        span = "nothing" if node.span is None else f"{node.span[0]}:{node.span[1]}"
        print(
            f"  node :{node.port} serves {span:8} resident {node.rss_bytes / 1e9:.2f} GB "
            f"(peak {node.peak_rss_bytes / 1e9:.2f} GB)"
        )
    swarm_rate = _median(swarm, "tokens_per_s")
    rpc = _llama_rpc(path, spec.layers, args.tokens, args.repeats)
    if rpc is not None:
        print(
            f"llama-bench, 1 thread a process: 1 process {rpc[1]:.2f} tok/s, RPC split 3 ways "
            f"{rpc[3]:.2f} tok/s ({rpc[3] / rpc[1]:.2f}x); swarm 1 process / llama.cpp "
            f"{one_rate / rpc[1]:.2f}x, 3 nodes / llama.cpp RPC 3 ways {swarm_rate / rpc[3]:.2f}x"
        )
    llama = _llama_cpp(path, ids, args.tokens, args.repeats)
    if llama is not None:
        print(
            f"llama.cpp, 1 thread, whole model: {llama:.2f} tok/s; 1 process / llama.cpp "
            f"{one_rate / llama:.2f}x, 3 nodes / llama.cpp {swarm_rate / llama:.2f}x"
        )
    print("routed experts against every expert computed: python -m bench.moe_decode")


if __name__ == "__main__":
    asyncio.run(main())
