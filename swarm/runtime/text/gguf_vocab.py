# ruff: noqa: RUF001 - DeepSeek's token texts hold fullwidth bars
"""A GGUF file's tokenizer fields read into one frozen record, with each token's attributes as
llama.cpp's vocabulary loader settles them (its token types, then its corrections by text:
end-of-turn and fill-in-the-middle tokens made control tokens, "unused" control tokens,
Phi-3's stripping of spaces after its special tokens), and its end-of-generation ids.

Pure: fields in, record out; `GGUFTokenizer` builds the engine from the record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from swarm.errors import CorruptModelError, UnsupportedModelError
from swarm.runtime.text.pre_tokenizers import pre_tokenizer


class TokenType(IntEnum):
    """tokenizer.ggml.token_type's values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr:
    """llama.cpp's token attributes (llama_token_attr), as plain int bits: a vocabulary has
    150k of them, and IntFlag's operators cost a microsecond each."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_FROM_TYPE: dict[int, int] = {
    TokenType.UNKNOWN: Attr.UNKNOWN,
    TokenType.UNUSED: Attr.UNUSED,
    TokenType.NORMAL: Attr.NORMAL,
    TokenType.CONTROL: Attr.CONTROL,
    TokenType.USER_DEFINED: Attr.USER_DEFINED,
    TokenType.BYTE: Attr.BYTE,
}
MODELS = ("gpt2", "llama")  # BPE and SentencePiece-style vocabularies

# Texts llama.cpp takes as these roles when the file does not name them (and then makes
# control tokens), in its order of roles; the id of a role found stays that role's.
_ROLE_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
            "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
_EOG_TEXTS = frozenset(
    ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
     "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
     "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
     "<｜end▁of▁sentence｜>", "[e~[")
)  # fmt: skip
_ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


@dataclass(frozen=True)
class GGUFVocab:
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str  # tokenizer.ggml.pre ("default" where the file has none, as llama.cpp reads it)
    tokens: tuple[str, ...]
    attrs: tuple[int, ...]  # Attr bits per token, as llama.cpp settles them
    scores: tuple[float, ...]  # empty when the file has none
    merges: tuple[str, ...]  # "left right", in rank order (gpt2)
    bos: int | None
    eos: int | None
    eog: frozenset[int]  # every id that ends a generation
    add_bos: bool | None  # None: the model kind's (or pre name's) default
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | None

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def vocab_from_fields(fields: Mapping[str, Any], where: str) -> GGUFVocab:
    """The record of a GGUF file's tokenizer fields; `where` names the file in errors."""
    model = fields.get("tokenizer.ggml.model")
    if model is None:
        raise CorruptModelError(f"{where}: the GGUF file has no tokenizer (no tokenizer.ggml.*)")
    if model not in MODELS:
        raise UnsupportedModelError(
            f"{where}: tokenizer.ggml.model {model!r} is not a tokenizer kind swarm implements "
            f"(known: {', '.join(MODELS)})"
        )
    pre = str(fields.get("tokenizer.ggml.pre") or "default")
    if model == "gpt2":
        pre_tokenizer(pre, where)  # refused before anything else is read
    tokens = _strings(fields, "tokenizer.ggml.tokens", where)
    types = list(fields.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens))
    scores = tuple(float(s) for s in fields.get("tokenizer.ggml.scores") or ())
    if len(types) < len(tokens) or (scores and len(scores) < len(tokens)):
        raise CorruptModelError(f"{where}: fewer token types or scores than tokens")
    if len(set(tokens)) != len(tokens):
        raise CorruptModelError(f"{where}: the vocabulary holds a token twice")
    merges = tuple(fields.get("tokenizer.ggml.merges") or ())
    if model == "gpt2" and not merges:
        raise CorruptModelError(f"{where}: a BPE vocabulary without tokenizer.ggml.merges")
    ids = _role_ids(fields, model, len(tokens))
    attrs = [_FROM_TYPE.get(t, Attr.UNDEFINED) for t in types[: len(tokens)]]
    eog = _settle_attrs(tokens, attrs, ids)
    name = str(fields.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        _phi3_strips(tokens, attrs)
    return GGUFVocab(
        model=str(model),
        pre=pre,
        tokens=tuple(tokens),
        attrs=tuple(attrs),
        scores=scores[: len(tokens)],
        merges=merges,
        bos=ids["bos"],
        eos=ids["eos"],
        eog=frozenset(eog),
        add_bos=_flag(fields, "tokenizer.ggml.add_bos_token"),
        add_eos=bool(_flag(fields, "tokenizer.ggml.add_eos_token")),
        add_space_prefix=_flag(fields, "tokenizer.ggml.add_space_prefix"),
        chat_template=_template(fields),
    )


def _strings(fields: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = fields.get(key)
    if not isinstance(value, list) or not value:
        raise CorruptModelError(f"{where}: the GGUF file has no {key}")
    # llama.cpp names an empty token by its id, so that no two tokens read the same
    return [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(value)]


def _flag(fields: Mapping[str, Any], key: str) -> bool | None:
    value = fields.get(key)
    return None if value is None else bool(value)


def _template(fields: Mapping[str, Any]) -> str | None:
    value = fields.get("tokenizer.chat_template")
    return value if isinstance(value, str) and value else None


def _role_ids(fields: Mapping[str, Any], model: str, n: int) -> dict[str, int | None]:
    # llama.cpp's defaults per kind, replaced by the file's ids where those lie in the vocab
    default = {"bos": 1, "eos": 2} if model == "llama" else {"bos": 11, "eos": 11}
    keys = {
        "bos": "bos_token_id",
        "eos": "eos_token_id",
        "eot": "eot_token_id",
        "eom": "eom_token_id",
        "fim_pre": "fim_pre_token_id",
        "fim_suf": "fim_suf_token_id",
        "fim_mid": "fim_mid_token_id",
        "fim_pad": "fim_pad_token_id",
        "fim_rep": "fim_rep_token_id",
        "fim_sep": "fim_sep_token_id",
    }
    ids: dict[str, int | None] = {}
    for role, key in keys.items():
        fallback = default.get(role)
        value = fields.get(f"tokenizer.ggml.{key}")
        chosen = value if isinstance(value, int) and 0 <= value < n else fallback
        ids[role] = chosen if chosen is not None and 0 <= chosen < n else None
    return ids


def _settle_attrs(tokens: Sequence[str], attrs: list[int], ids: dict[str, int | None]) -> set[int]:
    """llama.cpp's corrections by text, in place; returns the end-of-generation ids."""
    by_text = {t: i for i, t in enumerate(tokens)}
    for role, texts in _ROLE_TEXTS.items():
        if ids[role] is not None:
            continue
        # llama.cpp takes whichever of the texts its hash map yields first; a vocabulary
        # holding several is read here in the list's order
        found = next((by_text[t] for t in texts if t in by_text), None)
        if found is not None:
            ids[role] = found
            attrs[found] |= Attr.CONTROL
    for i, attr in enumerate(attrs):
        if attr & Attr.CONTROL and "unused" in tokens[i]:
            attrs[i] |= Attr.UNUSED
    eog: set[int] = set()
    for role in ("fim_pad", "fim_rep", "fim_sep"):
        if (found := ids[role]) is not None:
            eog.add(found)
    for text in _EOG_TEXTS:
        if text in by_text:
            eog.add(by_text[text])
            attrs[by_text[text]] |= Attr.CONTROL
    for text in _ALWAYS_SHOWN:
        if text in by_text:
            attrs[by_text[text]] = Attr.USER_DEFINED
    for role in ("eos", "eot", "eom"):
        if (found := ids[role]) is not None:
            eog.add(found)
    in_eog = {tokens[i] for i in eog}
    end = by_text.get("<|end|>")
    # gpt-oss and solar-open end a message with <|end|>, not the generation
    pairs = ({"<|return|>", "<|call|>"}, {"<|calls|>", "<|flush|>"})
    if end is not None and end in eog and any(p <= in_eog for p in pairs):
        eog.discard(end)
        attrs[end] = Attr.USER_DEFINED
    closing = by_text.get("</s>")
    if closing is not None and closing in eog and "<|tool_response>" in in_eog:  # gemma4
        eog.discard(closing)
        attrs[closing] = Attr.NORMAL
    return eog


def _phi3_strips(tokens: Sequence[str], attrs: list[int]) -> None:
    by_text = {t: i for i, t in enumerate(tokens)}
    for i, attr in enumerate(attrs):
        if attr & (Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN):
            attrs[i] |= Attr.RSTRIP
    if "</s>" in by_text:
        attrs[by_text["</s>"]] |= Attr.RSTRIP
    for text in ("<unk>", "<s>", "<|endoftext|>"):
        if text in by_text:
            attrs[by_text[text]] &= ~Attr.RSTRIP
