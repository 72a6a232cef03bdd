"""Token masks from a grammar, on a tokenizer that spells bytes: exactly the tokens that can
continue the grammar are left, the end of text only once it is complete, and a token outside
it is refused."""

from __future__ import annotations

import math

import pytest
import torch

from harness.factories import TINY_VOCAB, tiny_bytes_tokenizer
from swarm.api.formats import json_grammar
from swarm.errors import SamplingError
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.text.grammar import GrammarTokens
from swarm.runtime.text.hf_tokenizer import HFTokenizer
from swarm.sampling_settings import SamplingSettings

EOS = 2


def test_the_mask_leaves_exactly_what_can_continue_the_grammar() -> None:
    tokenizer = tiny_bytes_tokenizer()
    constraint = GrammarTokens(HFTokenizer(tokenizer), TINY_VOCAB, {EOS}).constraint(
        json_grammar({"enum": ["yes", "no"]}, "response_format")
    )

    def allowed() -> set[str]:
        masked = constraint.mask(torch.zeros(TINY_VOCAB))
        return {tokenizer.decode([i]) for i in range(TINY_VOCAB) if masked[i] != -math.inf}

    for char, then in [('"', {"y", "n"}), ("n", {"o"}), ("o", {'"'}), ('"', {"</s>"})]:
        assert char in allowed()
        constraint.accept(tokenizer.convert_tokens_to_ids(char))
        assert allowed() == then


def test_a_constrained_sampler_only_picks_allowed_tokens_and_refuses_others() -> None:
    tokenizer = tiny_bytes_tokenizer()
    tokens = GrammarTokens(HFTokenizer(tokenizer), TINY_VOCAB, {EOS})
    grammar = json_grammar({"type": "boolean"}, "response_format")
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=0), 0, tokens.constraint(grammar))
    picked: list[int] = []
    while not picked or picked[-1] != EOS:
        picked.append(sampler.next_token(torch.randn(TINY_VOCAB), picked))
    assert tokenizer.decode(picked[:-1]) in ("true", "false")
    constraint = tokens.constraint(grammar)
    with pytest.raises(SamplingError, match="outside the grammar"):
        constraint.accept(tokenizer.convert_tokens_to_ids("x"))


def test_a_gguf_vocabulary_builds_the_same_masks() -> None:
    # llguidance reads a GGUF tokenizer's token bytes and end-of-generation ids, not a
    # tokenizer.json: the embedded model's vocabulary, 49152 tokens
    from swarm.runtime.checkpoint.gguf_metadata import read_tokenizer_fields
    from swarm.runtime.checkpoint.source import resolve_model
    from swarm.runtime.text.gguf_tokenizer import GGUFTokenizer
    from swarm.runtime.text.gguf_vocab import vocab_from_fields

    path = resolve_model("smollm2-135m-instruct").path
    tokenizer = GGUFTokenizer(vocab_from_fields(read_tokenizer_fields(path), str(path)))
    vocab = tokenizer.vocab.n_tokens
    constraint = GrammarTokens(tokenizer, vocab, tokenizer.stop_ids).constraint(
        json_grammar({"enum": ["yes", "no"]}, "response_format")
    )

    def allowed() -> set[str]:
        masked = constraint.mask(torch.zeros(vocab))
        return {
            tokenizer.decode([i], skip_special=False)
            for i in range(vocab)
            if masked[i] != -math.inf
        }

    assert allowed() == {'"'}
    for text, then in [('"', {"y", "ye", "yes", "n", "no"}), ("no", {'"'})]:
        (token,) = tokenizer.encode(text, add_special=False)
        constraint.accept(token)
        assert allowed() == then
    constraint.accept(tokenizer.encode('"', add_special=False)[0])
    assert allowed() == {tokenizer.decode([i], skip_special=False) for i in tokenizer.stop_ids}
