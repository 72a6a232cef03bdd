"""What the entry needs of a tokenizer, whichever kind the model came with, and the one
function that loads the one a model cache holds.

A GGUF file's tokenizer is built from the file's own fields as llama.cpp reads them
(`GGUFTokenizer`); a Hugging Face folder or hub repository keeps its tokenizer.json and chat
template through transformers (`HFTokenizer`). Nothing above this module sees either."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from swarm.runtime.checkpoint.gguf_metadata import read_fields


class Tokenizer(Protocol):
    @property
    def chat_template(self) -> str | None: ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a generation besides the config's eos_token_id."""
        ...

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Special tokens written in `text` are parsed; `add_special` adds the BOS and EOS
        tokens the model asks for."""
        ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

    def chat_ids(self, messages: Sequence[dict[str, Any]], extra: dict[str, Any]) -> list[int]:
        """The conversation through the chat template, ending where the assistant's answer
        begins; `extra` is passed to the template (tools). Raises whatever the template
        raises."""
        ...

    def guidance_source(self, n_vocab: int) -> Any:
        """What llguidance.LLTokenizer is built from: a tokenizer.json text or a
        TokenizerWrapper-shaped object."""
        ...


def load_tokenizer(folder: Path, where: str | None = None) -> Tokenizer:
    """The tokenizer a model cache keeps in `folder` (its tokenizer folder); `where` names
    the model in errors."""
    fields = read_fields(folder)
    if fields is None:
        from swarm.runtime.text.hf_tokenizer import HFTokenizer

        return HFTokenizer.load(folder)
    from swarm.runtime.text.gguf_tokenizer import GGUFTokenizer
    from swarm.runtime.text.gguf_vocab import vocab_from_fields
    from swarm.runtime.text.ranked_pairs import cached_ranked_pairs

    vocab = vocab_from_fields(fields, where or str(folder))
    pairs = cached_ranked_pairs(folder, vocab) if vocab.model == "llama" else None
    return GGUFTokenizer(vocab, pairs)
