"""What one process generates: the reference the networked tests compare against."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from swarm.api.backend import Done
from swarm.config import RuntimeConfig
from swarm.inference.embedding import embed_all
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import LocalSwarm, load_local
from swarm.runtime.execution.pooling import pooling_of
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


async def converse_locally(
    runtime: RuntimeConfig, system: str, turns: Sequence[str], max_tokens: int
) -> list[list[dict[str, str]]]:
    """A greedy conversation in this process, every prompt computed whole (no prompt
    cache): the messages each turn sends (the system prompt, every turn and answer before
    it, then its own), its greedy answer last."""
    local = await load_local(dataclasses.replace(runtime, prompt_cache=False))
    try:
        messages = [{"role": "system", "content": system}]
        sent = []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            answer = await greedy(local, local.entry.encode_chat(messages), max_tokens)
            messages.append({"role": "assistant", "content": answer.text})
            sent.append(list(messages))
        return sent
    finally:
        local.compute.close()


async def complete_locally(runtime: RuntimeConfig, prompt: str, max_tokens: int) -> str:
    """The greedy completion of `prompt` as plain text (no chat template), in this process."""
    local = await load_local(runtime)
    try:
        return (await greedy(local, local.entry.encode_text(prompt), max_tokens)).text
    finally:
        local.compute.close()


async def embed_locally(
    runtime: RuntimeConfig, inputs: Sequence[str], split: str | None = None
) -> list[list[float]]:
    """Each text's embedding (unit length, the model's pooling), in this process."""
    local = await load_local(runtime, split)
    try:
        ids = [local.entry.encode_text(text) for text in inputs]
        pooling = pooling_of(local.entry.pooling_type)
        return await embed_all(local.entry, local.pipeline, local.compute, ids, pooling)
    finally:
        local.compute.close()


async def greedy(local: LocalSwarm, ids: Sequence[int], max_tokens: int) -> Generated:
    """The greedy continuation of `ids` through `local`: its tokens, text and count."""
    generated, _ = await answer(local, ids, SamplingSettings(max_tokens=max_tokens))
    return generated


async def answer(
    local: LocalSwarm, ids: Sequence[int], params: SamplingSettings
) -> tuple[Generated, Done]:
    """The continuation of `ids` through `local` under `params`, and how it finished."""
    tokens: list[int] = []
    parts: list[str] = []
    finish = None
    async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
        if isinstance(event, Chunk):
            parts.append(event.text)
            if event.token_id is not None:
                tokens.append(event.token_id)
        else:
            finish = event
    assert finish is not None, "a generation ends with its Done"
    return Generated(tokens, "".join(parts), finish.completion_tokens), finish
