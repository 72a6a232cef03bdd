"""Constrained decoding: a grammar (llguidance's, compiled from a JSON schema by the API layer)
turned into a mask over the vocabulary before each token is sampled, so the answer can only
be text the grammar accepts.

llguidance walks the tokenizer's vocabulary once per model (about a second, on the compute
thread, the first time a request asks) and then computes each token's mask in microseconds
to a few milliseconds; applying the mask is one masked fill over the logits."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

import llguidance
import numpy as np
import torch

from swarm.errors import SamplingError
from swarm.runtime.text.tokenizer import Tokenizer


class GrammarTokens:
    """The vocabulary as llguidance sees it, built once per entry on first use."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size  # rows of the lm_head: the logits' length
        self._eos = sorted(eos_ids)
        self._lock = threading.Lock()  # one build, whichever request asks first
        self._built: llguidance.LLTokenizer | None = None

    def _llg(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._built is None:
                source = self._tokenizer.guidance_source(self.vocab_size)
                if source is None:
                    raise SamplingError(
                        "this model's tokenizer has no fast (tokenizers) form, which "
                        "structured output needs",
                        "response_format",
                    )
                if not isinstance(source, str):  # token bytes and an encoder
                    source = llguidance.TokenizerWrapper(source)
                self._built = llguidance.LLTokenizer(
                    source,
                    n_vocab=self.vocab_size,
                    eos_token=self._eos if self._eos else None,
                )
            return self._built

    def constraint(self, grammar: str) -> TokenConstraint:
        """A fresh matcher for one request. SamplingError when the grammar does not compile
        against this vocabulary (the API layer checked it without one)."""
        matcher = llguidance.LLMatcher(self._llg(), grammar, log_level=0)
        if matcher.is_error():
            raise SamplingError(
                f"the requested format cannot be enforced: {matcher.get_error()}",
                "response_format",
            )
        return TokenConstraint(matcher, self.vocab_size)


class TokenConstraint:
    """One request's grammar state: mask the logits, then advance by the chosen token."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab = vocab_size
        # one bit per token, llguidance writes it in place
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: float32 [vocab] -> a copy with every token the grammar forbids at -inf.

        In numpy on the CPU: a few hundred microseconds for 49k tokens, where torch's own
        ops wait for their thread pool and take tens of milliseconds on a busy machine."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._matcher.is_error():
            raise SamplingError(f"structured output failed: {self._matcher.get_error()}")
        # bits are little-endian within each 32-bit word: token i is bit i % 32 of word i // 32
        forbidden = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab] == 0
        if logits.is_cpu:
            out = logits.numpy().copy()
            out[forbidden] = -np.inf
            return torch.from_numpy(out)
        return logits.masked_fill(torch.from_numpy(forbidden).to(logits.device), -math.inf)

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise SamplingError(
                f"structured output failed: token {token} is outside the grammar "
                f"({self._matcher.get_error()})"
            )
