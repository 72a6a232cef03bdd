"""The embedded model's greedy answers from swarm beside llama.cpp's own, prompt by prompt.

Each prompt is rendered with the model's chat template as swarm's API renders it, written out
token by token as text (special tokens included), and given to llama.cpp's `llama-simple`
(built by `python -m bench.llama_cpp_tools`), which reads it back and decodes greedily on one
thread. Beside each answer this prints what swarm (one process, packed) answers, and how many
of them are the same text. Both are approximations of the float32 model (llama.cpp keeps its
cache in float16, swarm in float32; the head's near-ties are re-scored in float32 by swarm), so
answers part where two tokens nearly tie; how often is what this shows.

    python -m bench.beside_llama_cpp [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from pathlib import Path

from bench import llama_cpp_tools
from swarm.config import RuntimeConfig
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.runtime.checkpoint.source import resolve_model
from swarm.runtime.execution.entry import EntryModel
from swarm.sampling_settings import SamplingSettings

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three tips for someone learning to cook.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Translate 'good morning' into French and Spanish.",
    "Write a Python function that reverses a string.",
    "Name the planets of the solar system in order.",
    "What is photosynthesis?",
    "Write the first sentence of a story about a dragon who is afraid of the dark.",
    "Give me a synonym for 'happy' and use it in a sentence.",
    "How do I make a cup of tea?",
]


def rendered(entry: EntryModel, prompt: str) -> tuple[list[int], str]:
    """The chat-templated prompt's ids, and the same tokens as text for llama.cpp to read."""
    ids = entry.encode_chat([{"role": "user", "content": prompt}])
    return ids, "".join(entry.token_text(i) for i in ids)


def llama_cpp_answer(simple: Path, model: Path, text: str, tokens: int) -> str:
    """llama-simple's greedy continuation of `text` (it prints the prompt, then the answer)."""
    out = subprocess.run(
        [str(simple), "-m", str(model), "-n", str(tokens), text],
        capture_output=True,
        check=True,
    ).stdout.decode()
    if not out.startswith(text):
        raise SystemExit(f"llama-simple read the prompt back differently: {out[:200]!r}")
    answer = out[len(text) :]
    return answer[:-1] if answer.endswith("\n") else answer  # its closing newline


async def swarm_answers(prompts: list[str], tokens: int) -> list[str]:
    local = await load_local(RuntimeConfig(dtype="packed", threads=1))
    try:
        answers = []
        for prompt in prompts:
            ids, _ = rendered(local.entry, prompt)
            params = SamplingSettings(max_tokens=tokens, speculate=False)
            parts = []
            async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
                if isinstance(event, Chunk):
                    parts.append(event.text)
            answers.append("".join(parts))
        return answers
    finally:
        local.compute.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    tools = llama_cpp_tools.built()
    if tools is None:
        raise SystemExit("llama.cpp's tools are not built: python -m bench.llama_cpp_tools")
    model = resolve_model(RuntimeConfig().model).path
    local = asyncio.run(load_local(RuntimeConfig(dtype="packed", threads=1)))
    texts = [rendered(local.entry, p)[1] for p in PROMPTS]
    local.compute.close()
    theirs = [llama_cpp_answer(tools.simple, model, t, args.tokens) for t in texts]
    ours = asyncio.run(swarm_answers(PROMPTS, args.tokens))
    same = 0
    for prompt, llama, swarm in zip(PROMPTS, theirs, ours, strict=True):
        same += llama == swarm
        print(f"{'same' if llama == swarm else 'DIFFERENT'}: {prompt}")
        if llama != swarm:
            print(f"  llama.cpp: {llama!r}\n  swarm:     {swarm!r}")
    print(f"{same} of {len(PROMPTS)} answers the same text ({args.tokens} tokens, greedy)")


if __name__ == "__main__":
    main()
