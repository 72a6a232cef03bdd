"""A small draft model at the entry: the whole model in this process, run on the entry's compute
thread, proposing greedy tokens for the target to verify.

Its drafts are the draft model's argmax, a function of the text alone, so accepting a draft
where the target's own sample equals it keeps the target's distribution (and a greedy
target's text) exactly: the draft model changes the speed, never the answer.

Each session keeps its own KV cache here, holding the tokens fed so far. A proposal feeds
only what the cache lacks: after the target rejected a draft, the cache rewinds to the
longest prefix the text still shares with it (a position below the cache's length rewinds
it) and goes on from there."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from swarm.config import RuntimeConfig
from swarm.errors import ConfigError, SwarmError
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, SessionId

log = logging.getLogger(__name__)
# a draft model's KV cache for all sessions, as a share of the target's budget: it serves the
# same sessions with a smaller model, whose tokens take a few times less cache each
KV_SHARE = 4


def vocabulary_mismatch(draft: EntryModel, target: EntryModel) -> str | None:
    """None where every token id means the same text to both (the head's rows included),
    else the first difference: a draft's token must be the target's token of the same id."""
    if draft.vocab_size != target.vocab_size:
        return f"its head has {draft.vocab_size} tokens, the target's {target.vocab_size}"
    for token in range(target.vocab_size):
        mine, theirs = _text_of(draft, token), _text_of(target, token)
        if mine != theirs:
            return f"token {token} is {mine!r} to it, {theirs!r} to the target"
    return None


def _text_of(entry: EntryModel, token: int) -> str | None:
    """A token's text; None for a head row the tokenizer has no token for (padding)."""
    try:
        return entry.token_text(token)
    except (IndexError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    # ms of the draft steps alone: a text the cache lacked (the prompt, or what came while
    # drafting paused) is fed first and not counted, a one-off cost that would otherwise
    # make the first drafts of every session look as if they never pay
    drafting_ms: float


class DraftModel:
    def __init__(self, name: str, entry: EntryModel, shard: Shard, chunk_tokens: int) -> None:
        self.name = name
        self._entry = entry
        self._shard = shard
        self._fed: dict[SessionId, list[int]] = {}  # the tokens each session's cache holds
        self._chunk = chunk_tokens  # a long text is fed in chunks of at most this many

    @classmethod
    def load(cls, model: str, runtime: RuntimeConfig, target: EntryModel) -> DraftModel:
        """Load `model` whole with the target's runtime settings (compute thread). Raises
        ConfigError, naming the model, where its vocabulary is not the target's."""
        own = replace(runtime, model=model, kv_cache_bytes=runtime.kv_cache_bytes // KV_SHARE)
        context = ModelContext.open(own, progress=False)
        entry = EntryModel(context)
        mismatch = vocabulary_mismatch(entry, target)
        if mismatch is not None:
            raise ConfigError(
                f"draft model {model} does not share the target's vocabulary: {mismatch}"
            )
        shard = Shard.load(context, LayerSpan(0, context.num_layers), own)
        return cls(model, entry, shard, runtime.prefill_chunk_tokens)

    @torch.inference_mode()
    def propose(self, session: SessionId, tokens: Sequence[int], limit: int) -> Proposal:
        """Up to `limit` greedy tokens to follow `tokens` (the whole text so far). Runs on the
        compute thread. A failure here (the cache full, say) drafts nothing: drafting is only
        ever a shortcut."""
        if limit <= 0 or not tokens:
            return Proposal([], 0.0)
        try:
            return self._propose(session, tokens, limit)
        except SwarmError as e:
            log.debug("session %s: the draft model drafts nothing (%s)", session, e)
            self.close(session)
            return Proposal([], 0.0)

    def _propose(self, session: SessionId, tokens: Sequence[int], limit: int) -> Proposal:
        fed = self._fed.get(session, []) if self._shard.has_session(session) else []
        # the text the cache lacks before its last token (the prompt, or what came while
        # drafting paused), fed as chunks; the last token's output is the first draft's
        last = len(tokens) - 1
        start = min(_common_prefix(fed, tokens), last)
        for at in range(start, last, self._chunk):
            chunk = tokens[at : min(at + self._chunk, last)]
            self._shard.forward(session, self._entry.embed(chunk), at)
        began = time.perf_counter()
        hidden = self._shard.forward(session, self._entry.embed(tokens[last:]), last)
        fed = list(tokens)
        drafts: list[int] = []
        while True:
            token = int(torch.argmax(self._entry.logits(hidden)))
            drafts.append(token)
            if len(drafts) == limit or token in self._entry.eos_token_ids:
                break
            hidden = self._shard.forward(session, self._entry.embed([token]), len(fed))
            fed.append(token)
        self._fed[session] = fed
        return Proposal(drafts, (time.perf_counter() - began) * 1000)

    def close(self, session: SessionId) -> None:
        self._fed.pop(session, None)
        self._shard.close_session(session)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
