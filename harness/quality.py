"""How closely a quantized runtime follows float32: next-token top-1 agreement.

The float32 runtime generates greedily; the other runtime is then fed the same tokens
(teacher-forced), so every position is judged on the same prefix and one early difference
does not derail the rest. Both run their real decode path (one token per step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.shard import Shard
from swarm.types import SessionId

_SESSION = SessionId("quality-probe")

TOPICS = [
    "how a rainbow forms",
    "why the sky is blue",
    "how vaccines work",
    "what causes earthquakes",
    "the water cycle",
    "how a refrigerator works",
    "what machine learning is",
    "how airplanes stay in the air",
    "the plot of Hamlet",
    "the benefits of regular exercise",
    "recursion, to a child",
    "how bread rises",
    "why leaves change colour in autumn",
    "how a bill becomes a law",
    "the difference between weather and climate",
    "how the internet routes a message",
    "what a black hole is",
    "how bees make honey",
    "the causes of the French Revolution",
    "how to learn a new language",
    "what inflation is",
    "how solar panels make electricity",
    "why we need sleep",
    "how a compass works",
    "the life cycle of a butterfly",
]
STYLES = ["Explain {} in a few sentences.", "Write a short paragraph for a teenager about {}."]


def prompts(count: int) -> list[str]:
    """`count` distinct chat prompts (topics x styles)."""
    every = [style.format(topic) for style in STYLES for topic in TOPICS]
    if count > len(every):
        raise ValueError(f"at most {len(every)} prompts")
    return every[:count]


@dataclass(frozen=True)
class Runtime:
    entry: EntryModel
    shard: Shard  # the whole model as one shard


@torch.inference_mode()
def decode(
    model: Runtime, ids: Sequence[int], steps: int, forced: Sequence[int] | None = None
) -> list[int]:
    """The top-1 token at each of `steps` positions after `ids`; the next input is the token
    itself (greedy) or `forced[i]` (teacher forcing)."""
    model.shard.close_session(_SESSION)
    hidden = model.shard.forward(_SESSION, model.entry.embed(ids), 0)
    position = len(ids)
    tops: list[int] = []
    for i in range(steps):
        tops.append(int(model.entry.logits(hidden).argmax()))
        if i == steps - 1:
            break
        token = tops[-1] if forced is None else forced[i]
        hidden = model.shard.forward(_SESSION, model.entry.embed([token]), position)
        position += 1
    model.shard.close_session(_SESSION)
    return tops


def prompt_ids(entry: EntryModel, text: str) -> list[int]:
    """`text` as a user's chat turn, or as a plain prompt for a model without a chat template
    (a base model's GGUF file)."""
    if entry.has_chat_template:
        return entry.encode_chat([{"role": "user", "content": text}])
    return entry.encode_text(text)


def references(reference: Runtime, texts: Sequence[str], steps: int) -> list[list[int]]:
    """(prompt ids + the reference's greedy tokens) for each prompt."""
    out = []
    for text in texts:
        ids = prompt_ids(reference.entry, text)
        out.append([*ids, *decode(reference, ids, steps)])
    return out


def agreement(candidate: Runtime, sequences: Sequence[Sequence[int]], steps: int) -> float:
    """Fraction of positions where the candidate's top-1 equals the reference's greedy token."""
    same = total = 0
    for seq in sequences:
        prompt, expected = seq[:-steps], seq[-steps:]
        got = decode(candidate, prompt, steps, forced=expected)
        same += sum(a == b for a, b in zip(got, expected, strict=True))
        total += steps
    return same / total
