"""swarm's GGUF tokenizer against llama.cpp, through golden data (bench.tokenizer_golden wrote
it from llama-cpp-python, which CI never builds): ids, decoded text, every token's piece, the
end-of-generation ids and the chat templates' prompts, for every vocabulary recorded there.

The embedded model's vocabulary (and that vocabulary under every `pre` name of the table) and
one SentencePiece vocabulary kept in tests/data run everywhere; the larger ones need the vocab
GGUF files the bench wrote (SWARM_TOKENIZER_GGUFS) and are skipped without them."""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from swarm.errors import CorruptModelError, UnsupportedModelError
from swarm.runtime.checkpoint.gguf_metadata import read_fields, read_tokenizer_fields, write_fields
from swarm.runtime.checkpoint.source import resolve_model
from swarm.runtime.text.chat_template import render_template
from swarm.runtime.text.gguf_tokenizer import GGUFTokenizer, partition
from swarm.runtime.text.gguf_vocab import Attr, vocab_from_fields
from swarm.runtime.text.pre_tokenizers import PRE_TOKENIZERS
from swarm.runtime.text.tokenizer import load_tokenizer

DATA = Path(__file__).parent / "data"
GGUFS = Path(os.environ.get("SWARM_TOKENIZER_GGUFS", "/work/.cache/tokenizer-gguf"))
GOLDEN: dict[str, Any] = json.loads(
    gzip.decompress((DATA / "tokenizer_golden.json.gz").read_bytes())
)
VOCABS = sorted(GOLDEN["vocabs"])


@functools.cache
def fields_of(name: str) -> dict[str, Any]:
    base, _, pre = name.partition("-pre-")
    if pre:
        return {**fields_of(base), "tokenizer.ggml.pre": pre}
    source = GOLDEN["vocabs"][name]["source"]
    if source == "embedded":
        return read_tokenizer_fields(resolve_model("smollm2-135m-instruct").path)
    if source == "committed":
        raw = gzip.decompress((DATA / f"{name}.fields.json.gz").read_bytes())
        return dict(json.loads(raw.decode("utf-8", errors="surrogatepass")))
    path = GGUFS / f"{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing: python -m bench.tokenizer_golden writes it")
    return read_tokenizer_fields(path)


@functools.cache
def tokenizer(name: str) -> GGUFTokenizer:
    return GGUFTokenizer(vocab_from_fields(fields_of(name), name))


@pytest.mark.parametrize("name", VOCABS)
def test_ids_and_text_are_llama_cpps(name: str) -> None:
    record, tok = GOLDEN["vocabs"][name], tokenizer(name)
    strings = [*GOLDEN["corpus"], *record["strings"]]
    for text, ids, plain, special in zip(
        strings, record["ids"], record["text"], record["text_special"], strict=True
    ):
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == plain, text
        assert tok.decode(ids, skip_special=False) == special, text


@pytest.mark.parametrize("name", VOCABS)
def test_every_piece_and_the_stop_ids_are_llama_cpps(name: str) -> None:
    record, tok = GOLDEN["vocabs"][name], tokenizer(name)
    for special, key in ((False, "pieces"), (True, "pieces_special")):
        h = hashlib.sha256()
        for i in range(record["n_tokens"]):
            piece = tok.piece(i, special)
            h.update(len(piece).to_bytes(4, "little") + piece)
        assert h.hexdigest() == record[key], f"special={special}"
    assert sorted(tok.stop_ids) == record["eog"]


@pytest.mark.parametrize("name", [n for n in VOCABS if "chat_ids" in GOLDEN["vocabs"][n]])
def test_chat_prompts_render_and_tokenize_as_llama_cpp(name: str) -> None:
    record, tok = GOLDEN["vocabs"][name], tokenizer(name)
    template = fields_of(name)["tokenizer.chat_template"]
    vocab = tok.vocab
    bos = "" if vocab.bos is None else vocab.tokens[vocab.bos]
    eos = "" if vocab.eos is None else vocab.tokens[vocab.eos]
    for chat, prompt, ids in zip(
        GOLDEN["chats"], record["chat_prompts"], record["chat_ids"], strict=True
    ):
        assert render_template(template, chat, bos_token=bos, eos_token=eos) == prompt
        assert tok.chat_ids(chat, {}) == ids


def test_the_cache_keeps_the_fields_and_loads_the_same_tokenizer(tmp_path: Path) -> None:
    fields = fields_of("smollm2")
    write_fields(tmp_path, fields)
    assert read_fields(tmp_path) == fields
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    assert read_fields(tmp_path / "elsewhere") is None


def test_a_sentencepiece_vocabularys_ranked_pairs_are_kept_and_read_back(tmp_path: Path) -> None:
    fields = fields_of("mistral-v3")
    record = GOLDEN["vocabs"]["mistral-v3"]
    strings = [*GOLDEN["corpus"], *record["strings"]]
    write_fields(tmp_path, fields)
    first = load_tokenizer(tmp_path)  # derives the pairs and keeps them
    (kept,) = tmp_path.glob(".spm-pairs-*.npy")
    again = load_tokenizer(tmp_path)  # reads them
    assert [again.encode(t) for t in strings] == [first.encode(t) for t in strings]
    assert [again.encode(t) for t in strings] == record["ids"]
    assert "gguf_tokenizer.json" in {p.name for p in tmp_path.iterdir()}
    kept.write_bytes(b"not a table")  # damaged: derived again, and replaced
    rederived = load_tokenizer(tmp_path)
    assert [rederived.encode(t) for t in strings] == record["ids"]
    assert np.load(kept).shape[1] == 2
    kept.unlink()
    # a cache it cannot write to (a folder where the table would be written; as root, a
    # read-only mode would not stop it): derived at each start, and still the same
    (tmp_path / f"{kept.name}.{os.getpid()}.partial").mkdir()
    unkept = load_tokenizer(tmp_path)
    assert [unkept.encode(t) for t in strings] == record["ids"]
    assert not kept.exists()


@pytest.mark.parametrize("name", ["mistral-v3", "gemma3"])
def test_the_hashed_pair_derivation_finds_what_slicing_every_token_finds(name: str) -> None:
    from swarm.runtime.text.gguf_tokenizer import _hashed_pairs, _sliced_pairs

    tokens = list(fields_of(name)["tokenizer.ggml.tokens"])
    tokens += [tokens[300], "\udcff\u2581a", "\u2581a", "\udcff"]  # a repeat, escaped bytes
    ids = {t: i for i, t in enumerate(tokens)}
    hashed, sliced = _hashed_pairs(ids), _sliced_pairs(ids)
    assert hashed is not None

    def rows(found: tuple[np.ndarray, ...]) -> set[tuple[int, ...]]:
        return set(zip(*(a.tolist() for a in found), strict=True))

    assert rows(hashed) == rows(sliced)
    assert len(hashed[0]) == len(sliced[0]) > 0


def test_a_changed_vocabulary_never_reads_the_pairs_of_the_old_one(tmp_path: Path) -> None:
    fields = fields_of("mistral-v3")
    write_fields(tmp_path, fields)
    load_tokenizer(tmp_path)
    scores = list(fields["tokenizer.ggml.scores"])
    scores[1000] += 1.0
    write_fields(tmp_path, {**fields, "tokenizer.ggml.scores": scores})
    load_tokenizer(tmp_path)
    assert len(list(tmp_path.glob(".spm-pairs-*.npy"))) == 2


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"tokenizer.ggml.pre": "no-such-split"}, UnsupportedModelError, r"'no-such-split'.*qwen2"),
        ({"tokenizer.ggml.model": "t5"}, UnsupportedModelError, r"'t5'.*gpt2, llama"),
        ({"tokenizer.ggml.model": None}, CorruptModelError, "has no tokenizer"),
        ({"tokenizer.ggml.merges": None}, CorruptModelError, "without tokenizer.ggml.merges"),
    ],
)
def test_what_it_cannot_tokenize_exactly_is_refused_in_one_line(
    change: dict[str, Any], error: type[Exception], message: str
) -> None:
    fields = {k: v for k, v in fields_of("smollm2").items() if change.get(k, 0) is not None}
    fields |= {k: v for k, v in change.items() if v is not None}
    with pytest.raises(error, match=message) as caught:
        GGUFTokenizer(vocab_from_fields(fields, "model.gguf"))
    assert "\n" not in str(caught.value)


SPECIALS = [("<a>", 7, Attr.CONTROL), ("<|x|>", 8, Attr.CONTROL | Attr.RSTRIP)]


@pytest.mark.parametrize(
    ("text", "specials", "expected"),
    [
        ("plain", SPECIALS, ["plain"]),
        ("", SPECIALS, []),
        ("x<a>y<a>", SPECIALS, ["x", 7, "y", 7]),
        ("<|x|>  \n next", SPECIALS, [8, "next"]),  # rstrip eats C's whitespace only
        ("a  <b>", [("<b>", 9, Attr.USER_DEFINED | Attr.LSTRIP)], ["a", 9]),
        # longest first: <ab> is taken before <a> could split it
        ("<ab><a>", [("<ab>", 1, Attr.CONTROL), ("<a>", 2, Attr.CONTROL)], [1, 2]),
    ],
)
def test_special_tokens_are_found_by_content(
    text: str, specials: list[tuple[str, int, Attr]], expected: list[str | int]
) -> None:
    assert partition(text, specials) == expected


def test_every_split_of_the_table_compiles() -> None:
    from tokenizers import Regex

    for split in PRE_TOKENIZERS.values():
        for pattern in split.regexes:
            Regex(pattern)
