"""What one process generates: the reference the networked tests compare against."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarm.config import RuntimeConfig
from swarm.inference.generation import Chunk, Finish, generate
from swarm.inference.local import LocalSwarm, load_local
from swarm.sampling_settings import SamplingSettings

# what the exactness tests ask the embedded model, and how many tokens they compare
PROMPTS = [
    "Describe the city of Paris for a first-time visitor.",
    "Write a short poem about the sea.",
    "Explain how a rainbow forms.",
]
NEW_TOKENS = 32


@dataclass(frozen=True)
class Generated:
    token_ids: list[int]
    text: str
    completion_tokens: int  # as the generation loop counted them


async def generate_locally(
    runtime: RuntimeConfig, prompts: Sequence[str], max_tokens: int, split: str | None = None
) -> list[Generated]:
    """Greedy answers to each prompt (as a chat message), in this process."""
    local = await load_local(runtime, split)
    try:
        results = []
        for prompt in prompts:
            ids = local.entry.encode_chat([{"role": "user", "content": prompt}])
            results.append(await greedy(local, ids, max_tokens))
        return results
    finally:
        local.compute.close()


async def complete_locally(runtime: RuntimeConfig, prompt: str, max_tokens: int) -> str:
    """The greedy completion of `prompt` as plain text (no chat template), in this process."""
    local = await load_local(runtime)
    try:
        return (await greedy(local, local.entry.encode_text(prompt), max_tokens)).text
    finally:
        local.compute.close()


async def greedy(local: LocalSwarm, ids: Sequence[int], max_tokens: int) -> Generated:
    """The greedy continuation of `ids` through `local`: its tokens, text and count."""
    tokens: list[int] = []
    parts: list[str] = []
    counted = -1
    params = SamplingSettings(max_tokens=max_tokens)
    async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
        if isinstance(event, Chunk):
            parts.append(event.text)
            if event.token_id is not None:
                tokens.append(event.token_id)
        elif isinstance(event, Finish):
            counted = event.completion_tokens
    return Generated(tokens, "".join(parts), counted)
