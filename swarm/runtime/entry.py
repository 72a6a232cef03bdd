"""The pieces every node keeps to act as a request's entry: tokenizer (with chat template),
embedding, final norm and lm_head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from swarm.errors import ModelError
from swarm.runtime.families.generic import materialize
from swarm.runtime.model import ModelContext

ChatMessage = dict[str, str]  # {"role": ..., "content": ...}


class EntryModel:
    def __init__(self, context: ModelContext) -> None:
        self.context = context
        self.tokenizer = context.store.load_tokenizer()
        skeleton: Any = context.skeleton()
        embed = context.to_runtime(context.store.load_embedding())
        head = context.to_runtime(context.store.load_head())
        self._embed = materialize(
            skeleton.model.embed_tokens, {"weight": embed["embed_tokens.weight"]}
        )
        self._norm = materialize(
            skeleton.model.norm,
            {k[len("norm.") :]: v for k, v in head.items() if k.startswith("norm.")},
        )
        self._lm_head = head["lm_head.weight"]
        self._lm_head_bias = head.get("lm_head.bias")
        self.eos_token_ids = _eos_ids(context.config, self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return int(self._lm_head.shape[0])

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        if not self.tokenizer.chat_template:
            raise ModelError("this model's tokenizer has no chat template; send a plain prompt")
        encoded = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True
        )
        ids = (
            encoded["input_ids"]
            if isinstance(encoded, dict) or hasattr(encoded, "keys")
            else encoded
        )
        return [int(i) for i in ids]

    def token_text(self, token_id: int) -> str:
        """One token alone as text, special tokens included (as logprobs show them)."""
        return str(self.tokenizer.decode([token_id]))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    @torch.inference_mode()
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """Token ids -> hidden states [1, seq, hidden_size]."""
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.vocab_size})")
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.context.device)
        return self._embed(tokens)  # type: ignore[no-any-return]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [1, seq, hidden] -> float32 logits of the last position [vocab]."""
        last = hidden[:, -1:, :].to(device=self.context.device, dtype=self.context.dtype)
        out = F.linear(self._norm(last), self._lm_head, self._lm_head_bias)
        return out[0, -1].float()


def _eos_ids(config: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for value in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
