"""Choosing the next token from logits: a grammar's mask where one is asked, logit bias,
penalties (repetition, presence, frequency), greedy or temperature with top-k, top-p and min-p,
seeded for reproducibility. The settings come checked (`swarm.sampling_settings`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from swarm.runtime.text.grammar import TokenConstraint
from swarm.sampling_settings import SamplingSettings


class Sampler:
    def __init__(
        self,
        params: SamplingSettings,
        prompt_tokens: int = 0,
        constraint: TokenConstraint | None = None,
    ) -> None:
        self.params = params
        self._constraint = constraint  # params.grammar compiled for this vocabulary
        self._prompt_tokens = prompt_tokens  # history beyond them is generated: what's penalized
        self._generator = torch.Generator()
        if params.seed is not None:
            self._generator.manual_seed(params.seed)
        else:
            self._generator.seed()

    def next_token(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        """logits: float32 [vocab]; history: every token id of the sequence so far."""
        token = self._choose(logits, history)
        if self._constraint is not None:
            self._constraint.accept(token)
        return token

    def _choose(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        p = self.params
        if self._constraint is not None:
            logits = self._constraint.mask(logits)
        if p.logit_bias:
            logits = apply_logit_bias(logits, p.logit_bias)
        if p.repetition_penalty != 1.0 and history:
            logits = apply_repetition_penalty(logits, history, p.repetition_penalty)
        generated = history[self._prompt_tokens :]
        if (p.presence_penalty or p.frequency_penalty) and generated:
            logits = apply_openai_penalties(
                logits, generated, p.presence_penalty, p.frequency_penalty
            )
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k:
            logits = _keep_top_k(logits, p.top_k)
        if p.top_p < 1.0:  # top_p 0 keeps only the most likely token, as a tiny nucleus does
            logits = _keep_top_p(logits, max(p.top_p, 1e-6))
        if p.min_p > 0:
            logits = _keep_min_p(logits, p.min_p)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))


def apply_repetition_penalty(
    logits: torch.Tensor, history: Sequence[int], penalty: float
) -> torch.Tensor:
    """As in the CTRL paper and transformers: divide positive logits, multiply negative ones."""
    ids = torch.tensor(sorted(set(history)), dtype=torch.long)
    seen = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def top_logprobs(logits: torch.Tensor, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The model's own log-probabilities (raw logits, no sampling setting applied): the
    chosen token's, and the n likeliest (id, logprob), best first."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logprobs, min(n, logprobs.shape[-1])) if n else None
    pairs = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist(), strict=True))
    return float(logprobs[token]), pairs


def apply_logit_bias(logits: torch.Tensor, bias: Sequence[tuple[int, float]]) -> torch.Tensor:
    ids = torch.tensor([i for i, _ in bias], dtype=torch.long)
    logits = logits.clone()
    logits[ids] += torch.tensor([b for _, b in bias], dtype=logits.dtype)
    return logits


def apply_openai_penalties(
    logits: torch.Tensor, generated: Sequence[int], presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's definition: logit[j] -= count[j] * frequency + (count[j] > 0) * presence,
    counting only the tokens generated so far, not the prompt's."""
    counts = torch.bincount(
        torch.tensor(generated, dtype=torch.long), minlength=logits.shape[-1]
    ).to(logits.dtype)
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


def _keep_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), -math.inf)


def _keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < threshold, -math.inf)


def _keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    # drop a token when the mass before it already reaches top_p; the first is always kept
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)
