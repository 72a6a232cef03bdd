"""A Hugging Face tokenizer (tokenizer.json and tokenizer_config.json, with its chat
template) behind the `Tokenizer` protocol, through transformers as before."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm.errors import CorruptModelError


class HFTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, folder: Path) -> HFTokenizer:
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(str(folder)))
        except (OSError, ValueError) as e:
            raise CorruptModelError(f"{folder}: unreadable tokenizer: {e}") from None

    @property
    def chat_template(self) -> str | None:
        template = self._tokenizer.chat_template
        return str(template) if template else None

    @property
    def stop_ids(self) -> frozenset[int]:
        value = self._tokenizer.eos_token_id
        return frozenset() if value is None else frozenset({int(value)})

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text, add_special_tokens=add_special)]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special))

    def chat_ids(self, messages: Sequence[dict[str, Any]], extra: dict[str, Any]) -> list[int]:
        encoded = self._tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, **extra
        )
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(i) for i in ids]

    def guidance_source(self, n_vocab: int) -> Any:
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        return backend.to_str()
