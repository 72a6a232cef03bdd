"""The pieces every node keeps to act as a request's entry: tokenizer (with chat template),
embedding, final norm and lm_head."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from swarm.errors import ModelError, NoChatTemplateError
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.families.generic import materialize, submodule
from swarm.runtime.text.chat import render_chat
from swarm.runtime.text.grammar import GrammarTokens
from swarm.runtime.text.tokenizer import Tokenizer, load_tokenizer
from swarm.runtime.weights.packed import HeadShortlist, Matrices, PackedTensor
from swarm.runtime.weights.quant import linear, rows_alone

ChatMessage = dict[str, Any]  # OpenAI's: {"role", "content"}, tool_calls, tool_call_id


class EntryModel:
    def __init__(self, context: ModelContext) -> None:
        self.context = context
        store = context.store
        self.tokenizer = load_tokenizer(store.tokenizer_folder, store.manifest.source)
        family = context.family
        embed = context.to_runtime(context.store.load_embedding())
        head = context.to_runtime(context.store.load_head())
        floats = {k: v for k, v in head.items() if isinstance(v, torch.Tensor)}
        # the embedding is a plain lookup here (a packed table row by row): a family's scaled
        # embedding module keeps its scale in a non-persistent buffer, which a meta-device
        # skeleton never fills
        self._embedding = embed["embed_tokens.weight"]
        scale = family.embed_scale(context.config)
        self._embed_scale = (
            None
            if scale is None
            else torch.tensor(scale, dtype=context.dtype, device=context.device)
        )
        self._norm = materialize(
            submodule(context.skeleton(), family.paths.norm),
            {k[len("norm.") :]: v for k, v in floats.items() if k.startswith("norm.")},
        )
        head_blocks = head["lm_head.weight"]
        self._lm_head = Matrices(context.device).fused([head_blocks])
        self._lm_head_bias = floats.get("lm_head.bias")
        self._shortlist = None
        if isinstance(head_blocks, PackedTensor) and context.device.type == "cpu":
            # a tied head re-scores from the embedding's blocks, already held
            if context.store.manifest.tie_word_embeddings and isinstance(
                self._embedding, PackedTensor
            ):
                head_blocks = self._embedding
            self._shortlist = HeadShortlist(head_blocks, self._lm_head_bias)
        self._softcap = family.logit_softcap(context.config)
        # the GGUF file's `<arch>.pooling_type` (pooling.py), None where it names none
        self.pooling_type: object = getattr(context.config, "gguf_pooling_type", None)
        self.eos_token_ids = _eos_ids(context.config, self.tokenizer)
        self.grammar = GrammarTokens(self.tokenizer, self.vocab_size, self.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return int(self._lm_head.shape[0])

    @property
    def head_bytes(self) -> int:
        """Bytes of the lm_head matrix as held, all read every token."""
        return int(self._lm_head.nbytes)

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True)

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.chat_template is not None

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        if not self.has_chat_template:
            raise NoChatTemplateError(
                "this model has no chat template (a base model): "
                "send a plain prompt to /v1/completions instead"
            )
        return render_chat(self.tokenizer, messages, tools)

    def token_text(self, token_id: int) -> str:
        """One token alone as text, special tokens included (as logprobs show them)."""
        return self.tokenizer.decode([token_id], skip_special=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special=True)

    @torch.inference_mode()
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """Token ids -> hidden states [1, seq, hidden_size]."""
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.vocab_size})")
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.context.device)
        if isinstance(self._embedding, PackedTensor):
            hidden = self._embedding.rows(tokens[0], self.context.dtype).unsqueeze(0)
        else:
            hidden = F.embedding(tokens, self._embedding)
        return hidden if self._embed_scale is None else hidden * self._embed_scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [1, seq, hidden] -> float32 logits of the last position [vocab]."""
        return self.last_logits([hidden])[0]

    def row_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every position's logits of hidden states [1, seq, hidden], float32 [seq, vocab],
        each the bits `logits` gives that position alone (`rows_logits` of one)."""
        return self.rows_logits([hidden])[0]

    def rows_logits(self, hiddens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every position's logits of each of several hidden states ([1, seq_i, hidden]
        each): float32 [seq_i, vocab] each. Where the head's kernel computes rows alone, every
        row of every sequence is one product, each row the bits `logits` gives it alone;
        elsewhere the sequences of one position share one product (as `last_logits`, to
        float rounding), and every position of a longer one is a product of its own, the
        bits `logits` gives it (a verify step's rows, which must be a decode step's)."""
        if rows_alone(self._lm_head):
            rows = [h[:, i : i + 1] for h in hiddens for i in range(h.shape[1])]
            logits = self.last_logits(rows)
            ends = list(itertools.accumulate(h.shape[1] for h in hiddens))
            return [logits[end - h.shape[1] : end] for h, end in zip(hiddens, ends, strict=True)]
        single = [h for h in hiddens if h.shape[1] == 1]
        shared: Iterator[torch.Tensor] = iter(self.last_logits(single) if single else [])
        return [
            next(shared).unsqueeze(0)
            if h.shape[1] == 1
            else torch.cat([self.last_logits([h[:, i : i + 1]]) for i in range(h.shape[1])])
            for h in hiddens
        ]

    @torch.inference_mode()
    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [1, seq, hidden] after the final norm, float32 [seq, hidden]: what
        the head's product reads, llama.cpp's embeddings."""
        rows = hidden.to(device=self.context.device, dtype=self.context.dtype)
        normed: torch.Tensor = self._norm(rows)
        return normed[0].float()

    @property
    def hidden_size(self) -> int:
        """The width of a hidden state: an embedding's."""
        return int(self.context.hidden_size)

    @torch.inference_mode()
    def last_logits(self, hiddens: Sequence[torch.Tensor]) -> torch.Tensor:
        """The logits of the last position of each of several sequences ([1, seq_i, hidden]
        each) as one product with the head: float32 [len(hiddens), vocab]."""
        last = torch.cat([h[:, -1:, :] for h in hiddens]).to(
            device=self.context.device, dtype=self.context.dtype
        )
        normed = self._norm(last)
        out = linear(normed, self._lm_head, self._lm_head_bias)
        if self._shortlist is not None:
            self._shortlist.rescore(normed[:, -1], out[:, -1])
        if self._softcap is not None:
            out = torch.tanh(out / self._softcap) * self._softcap
        return out[:, -1].float()


def _eos_ids(config: Any, tokenizer: Tokenizer) -> frozenset[int]:
    ids: set[int] = set(tokenizer.stop_ids)
    value = getattr(config, "eos_token_id", None)
    if isinstance(value, int):
        ids.add(value)
    elif isinstance(value, (list, tuple)):
        ids.update(int(v) for v in value)
    return frozenset(ids)
