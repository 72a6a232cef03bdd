"""A GGUF file's tokenizer as llama.cpp runs it, with the `tokenizers` library merging words.

Encoding follows llama.cpp's `llama_vocab::tokenize` with special tokens parsed: control,
user-defined and unknown tokens are found in the text by content first (longest first, each
one's leftmost occurrences, with its stripping of spaces), then each stretch of text between
them is tokenized alone:

- `gpt2` (BPE): split by the `pre` name's regular expressions (`pre_tokenizers`), each word
  mapped to GPT-2's byte characters and merged by rank;
- `llama` (SentencePiece-style): a space put before each stretch (add_space_prefix), spaces
  written as U+2581, then pairs merged by the score of the token they make, with bytes
  (`<0xNN>`) for what no token covers. `tokenizers`' BPE does that merge when its merges are
  the vocabulary's pairs ranked by that score.

Decoding is llama.cpp's token-to-piece, one token at a time: control and unknown tokens are
empty unless special tokens are asked for, user-defined tokens are their text, byte tokens
their byte; nothing is stripped or cleaned, as llama.cpp's server streams it."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from swarm.errors import CorruptModelError
from swarm.runtime.text.chat_template import render_template
from swarm.runtime.text.gguf_vocab import Attr, GGUFVocab
from swarm.runtime.text.pre_tokenizers import pre_tokenizer

_SPECIAL = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
_HIDDEN = Attr.CONTROL | Attr.UNKNOWN  # left out of decoded text unless asked for
_ISSPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp strips with
_SPACE = "\u2581"  # SentencePiece's escaped space


class GGUFTokenizer:
    def __init__(self, vocab: GGUFVocab, ranked_pairs: np.ndarray | None = None) -> None:
        """`ranked_pairs`: a SentencePiece-style vocabulary's `score_ranked_pairs`, where they
        were kept from an earlier start (most of the time such a vocabulary takes to load)."""
        self.vocab = vocab
        self._spm = vocab.model == "llama"
        if self._spm:
            default_bos, self._space_prefix = True, vocab.add_space_prefix is not False
            pairs = score_ranked_pairs(vocab) if ranked_pairs is None else ranked_pairs
            self._engine = _spm_engine(vocab, pairs)
        else:
            split = pre_tokenizer(vocab.pre)
            default_bos, self._space_prefix = bool(split.add_bos), False
            self._engine = _bpe_engine(vocab, split.regexes, split.ignore_merges)
        self.add_bos = default_bos if vocab.add_bos is None else vocab.add_bos
        for flag, role, name in (
            (self.add_bos, vocab.bos, "bos"),
            (vocab.add_eos, vocab.eos, "eos"),
        ):
            if flag and role is None:
                raise CorruptModelError(f"add_{name}_token is set but the file has no {name} id")
        specials = [i for i, a in enumerate(vocab.attrs) if a & _SPECIAL]
        specials.sort(key=lambda i: -len(vocab.tokens[i].encode("utf-8", "surrogateescape")))
        self._specials = [(vocab.tokens[i], i, vocab.attrs[i]) for i in specials]
        # filled as tokens are decoded (a dict's set is atomic: no lock for the threads)
        self._pieces: dict[tuple[int, bool], bytes] = {}

    # -- the Tokenizer protocol (swarm.runtime.text.tokenizer)

    @property
    def chat_template(self) -> str | None:
        return self.vocab.chat_template

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.vocab.eog

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        vocab = self.vocab
        ids: list[int] = (
            [vocab.bos] if add_special and self.add_bos and vocab.bos is not None else []
        )
        after_special = True  # a stretch at the start or after a special token
        for fragment in partition(text, self._specials):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
                continue
            if self._spm:
                prefix = " " if self._space_prefix and after_special else ""
                fragment = (prefix + fragment).replace(" ", _SPACE)
            ids.extend(self._engine.encode(fragment, add_special_tokens=False).ids)
            after_special = False
        if add_special and vocab.add_eos and vocab.eos is not None:
            ids.append(vocab.eos)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self.decode_bytes(ids, not skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int], special: bool) -> bytes:
        return b"".join(self.piece(i, special) for i in ids)

    def piece(self, token: int, special: bool) -> bytes:
        """llama.cpp's token_to_piece (no leading spaces stripped)."""
        key = (token, special)
        found = self._pieces.get(key)
        if found is None:
            found = _piece(self.vocab, token, special, self._spm)
            self._pieces[key] = found
        return found

    def chat_ids(self, messages: Sequence[dict[str, Any]], extra: dict[str, Any]) -> list[int]:
        """The conversation through the file's chat template, tokenized as llama.cpp's server
        does: the BOS and EOS texts the template writes at the ends are left to the tokenizer,
        which adds them where the file asks for them."""
        template = self.vocab.chat_template
        if template is None:
            raise CorruptModelError("this model has no chat template")
        bos, eos = self._text(self.vocab.bos), self._text(self.vocab.eos)
        text = render_template(template, messages, bos_token=bos, eos_token=eos, **extra)
        if self.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        if self.vocab.add_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        return self.encode(text, add_special=True)

    def guidance_source(self, n_vocab: int) -> Any:
        """What llguidance builds its vocabulary from: every token's bytes (special tokens
        marked as such) and this tokenizer for the text it needs tokenized."""
        return _GuidanceVocab(self, n_vocab)

    def _text(self, token: int | None) -> str:
        return "" if token is None else self.vocab.tokens[token]


def partition(text: str, specials: Sequence[tuple[str, int, int]]) -> list[str | int]:
    """llama.cpp's special-token partition: `text` as stretches of text and token ids, each
    special token (longest first) taking its leftmost occurrences in what is still text."""
    fragments: list[str | int] = [text] if text else []
    for content, token, attr in specials:
        if not any(isinstance(f, str) and content in f for f in fragments):
            continue
        out: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int) or content not in fragment:
                out.append(fragment)
                continue
            start = 0
            while (at := fragment.find(content, start)) != -1:
                left = fragment[start:at]
                if attr & Attr.LSTRIP:
                    left = left.rstrip(_ISSPACE)
                if left:
                    out.append(left)
                out.append(token)
                start = at + len(content)
                if attr & Attr.RSTRIP:
                    while start < len(fragment) and fragment[start] in _ISSPACE:
                        start += 1
            if start < len(fragment):
                out.append(fragment[start:])
        fragments = out
    return fragments


def _piece(vocab: GGUFVocab, token: int, special: bool, spm: bool) -> bytes:
    if not 0 <= token < vocab.n_tokens:
        return b""
    attr, text = vocab.attrs[token], vocab.tokens[token]
    if attr & _HIDDEN and not special:
        return b""
    if attr & _SPECIAL:
        return text.encode("utf-8", "surrogateescape")
    if attr & Attr.NORMAL:
        if spm:
            return text.replace(_SPACE, " ").encode("utf-8", "surrogateescape")
        return _byte_level_decode(text)
    if attr & Attr.BYTE:
        return bytes([int(text[3:5], 16)])
    return b""  # unused and undefined tokens


@functools.cache
def byte_chars() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


@functools.cache
def _char_bytes() -> dict[str, int]:
    return {c: b for b, c in byte_chars().items()}


def _byte_level_decode(text: str) -> bytes:
    table, out = _char_bytes(), bytearray()
    for char in text:
        byte = table.get(char)
        if byte is None:  # as llama.cpp writes a character outside GPT-2's map
            hexes = "".join(f"{b:02x}" for b in char.encode("utf-8", "surrogateescape"))
            out += f"[UNK_BYTE_0x{hexes}{text}]".encode("utf-8", "surrogateescape")
        else:
            out.append(byte)
    return bytes(out)


def _bpe_engine(vocab: GGUFVocab, regexes: Sequence[str], ignore_merges: bool) -> Tokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    engine = Tokenizer(models.BPE(ids, _pairs(vocab.merges, ids), ignore_merges=ignore_merges))
    splits: list[Any] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes
    ]
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    engine.pre_tokenizer = pre_tokenizers.Sequence(splits)
    return engine


def _pairs(merges: Sequence[str], ids: dict[str, int]) -> list[tuple[str, str]]:
    """The merges as pairs, in rank order. Where the list is plain (no merge twice, as
    llama.cpp keeps a pair's first rank; none starting with a space; every pair and its
    token in the vocabulary, which tokenizers requires) this runs in C: the Python loop
    below costs half a second on a 150k vocabulary."""
    if merges and len(set(merges)) == len(merges) and not any(m[0] == " " for m in merges):
        split = [m.split(" ", 1) for m in merges]
        if set(map(len, split)) == {2}:
            lefts, rights = zip(*split, strict=True)
            known = ids.__contains__
            made = map(operator.add, lefts, rights)
            if all(map(known, lefts)) and all(map(known, rights)) and all(map(known, made)):
                return list(zip(lefts, rights, strict=True))
    kept: dict[tuple[str, str], None] = {}
    for merge in merges:
        cut = merge.find(" ", 1)
        left, right = merge[:cut], merge[cut + 1 :]
        # a merge outside the vocabulary is left out: llama.cpp would make the pair and
        # then fall back to bytes, which no real vocabulary asks for
        if cut != -1 and left in ids and right in ids and left + right in ids:
            kept.setdefault((left, right), None)
    return list(kept)


def _spm_engine(vocab: GGUFVocab, pairs: np.ndarray) -> Tokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    tokens = vocab.tokens
    ranked = [(tokens[left], tokens[right]) for left, right in pairs.tolist()]
    unk = next(
        (t for t, a in zip(vocab.tokens, vocab.attrs, strict=True) if a & Attr.UNKNOWN), None
    )
    return Tokenizer(models.BPE(ids, ranked, unk_token=unk, byte_fallback=True))


def score_ranked_pairs(vocab: GGUFVocab) -> np.ndarray:
    """Every way to make a token from two tokens, as int32 [pairs, 2] of (left id, right id),
    ranked by the score of the token made (llama.cpp merges the pair whose token scores
    highest), ties by id, then cut. A repeated token counts under its last id.

    Each token's prefixes are hashed in numpy, a column of cuts at a time for all tokens of
    one length, and looked up among the tokens' own hashes; every pair found is then checked
    by its text, so a hash collision can only send the work to the slower exact way (Python
    slices, 1.8 s of CPU on Gemma 3's 262k entries against 0.7 s)."""
    tokens = vocab.tokens
    ids = {t: i for i, t in enumerate(tokens)}
    found = _hashed_pairs(ids)
    if found is None or not all(
        tokens[left] + tokens[right] == tokens[made]
        for left, right, made in zip(*(a.tolist() for a in found[:3]), strict=True)
    ):
        found = _sliced_pairs(ids)
    lefts, rights, made, cuts = found
    scores = np.asarray(vocab.scores or np.zeros(vocab.n_tokens), dtype=np.float64)
    order = np.lexsort((cuts, made, -scores[made]))
    return np.stack([lefts.astype(np.int32), rights.astype(np.int32)], 1)[order]


_HASH_BASE = np.uint64(0x100000001B3)
_Found = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # lefts, rights, made, cuts


def _by_length(ids: dict[str, int]) -> dict[int, tuple[list[str], list[int]]]:
    groups: dict[int, tuple[list[str], list[int]]] = {}
    for token, i in ids.items():
        texts, numbers = groups.setdefault(len(token), ([], []))
        texts.append(token)
        numbers.append(i)
    return groups


def _hashed_pairs(ids: dict[str, int]) -> _Found | None:
    groups = _by_length(ids)
    if not groups:
        return None
    hashed: list[tuple[int, np.ndarray, np.ndarray]] = []  # length, ids, prefix hashes
    with np.errstate(over="ignore"):  # the hashes wrap around 2**64 on purpose
        for length, (texts, numbers) in groups.items():
            raw = "".join(texts).encode("utf-32-le", "surrogatepass")
            points = np.frombuffer(raw, dtype=np.uint32).reshape(len(texts), length)
            h = np.zeros((len(texts), length + 1), dtype=np.uint64)
            for c in range(length):
                h[:, c + 1] = h[:, c] * _HASH_BASE + points[:, c].astype(np.uint64) + 1
            hashed.append((length, np.asarray(numbers, dtype=np.int64), h))
        keys = np.concatenate([h[:, length] for length, _, h in hashed])
        values = np.concatenate([numbers for _, numbers, _ in hashed])
        order = np.lexsort((values, keys))
        keys, values = keys[order], values[order]
        powers = np.cumprod(np.full(max(groups) + 1, _HASH_BASE, dtype=np.uint64))
        powers = np.concatenate([np.ones(1, dtype=np.uint64), powers])

        def lookup(wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            at = np.maximum(np.searchsorted(keys, wanted, side="right") - 1, 0)
            return keys[at] == wanted, values[at]

        lefts: list[np.ndarray] = []
        rights: list[np.ndarray] = []
        made: list[np.ndarray] = []
        cuts: list[np.ndarray] = []
        for length, group_ids, h in hashed:
            for cut in range(1, length):
                left_ok, left = lookup(h[:, cut])
                right_ok, right = lookup(h[:, length] - h[:, cut] * powers[length - cut])
                both = left_ok & right_ok
                if both.any():
                    lefts.append(left[both])
                    rights.append(right[both])
                    made.append(group_ids[both])
                    cuts.append(np.full(int(both.sum()), cut, dtype=np.int64))
    if not lefts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    return np.concatenate(lefts), np.concatenate(rights), np.concatenate(made), np.concatenate(cuts)


def _sliced_pairs(ids: dict[str, int]) -> _Found:
    known, index = ids.__contains__, ids.__getitem__
    lefts: list[int] = []
    rights: list[int] = []
    made: list[int] = []
    cuts: list[int] = []
    for length, (group, _) in _by_length(ids).items():
        for cut in range(1, length):
            left = [t[:cut] for t in group]
            right = [t[cut:] for t in group]
            both = list(map(operator.and_, map(known, left), map(known, right)))
            lefts += map(index, itertools.compress(left, both))
            rights += map(index, itertools.compress(right, both))
            before = len(made)
            made += map(index, itertools.compress(group, both))
            cuts += itertools.repeat(cut, len(made) - before)
    return tuple(np.asarray(x, dtype=np.int64) for x in (lefts, rights, made, cuts))  # type: ignore[return-value]


class _GuidanceVocab:
    """llguidance's TokenizerWrapper reads these four attributes and calls the object."""

    def __init__(self, tokenizer: GGUFTokenizer, n_vocab: int) -> None:
        vocab = tokenizer.vocab
        self.eos_token_id = vocab.eos
        self.bos_token_id = vocab.bos
        pieces = [tokenizer.piece(i, special=True) for i in range(vocab.n_tokens)]
        self.tokens = pieces + [b""] * max(0, n_vocab - len(pieces))
        self.special_token_ids = [i for i, a in enumerate(vocab.attrs) if a & _HIDDEN]
        self._encode: Callable[[str], list[int]] = functools.partial(
            tokenizer.encode, add_special=False
        )

    def __call__(self, text: bytes) -> list[int]:
        return self._encode(text.decode("utf-8", errors="replace"))
