"""Test data built locally: a tiny random Llama in a Hugging Face folder, with a word-level
tokenizer, so unit tests run in seconds and download nothing; and the member records that
placement, routing and membership tests are tables of."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from swarm.placement import Plan
from swarm.types import Capacity, LayerSpan, Load, MemberRecord, ModelId, NodeId

TINY_VOCAB = 300
MODEL = ModelId("a" * 64)  # the model a member record serves unless told otherwise


def tiny_llama_config(**overrides: Any) -> Any:
    from transformers import LlamaConfig

    values: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(TINY_VOCAB - 3)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return fast_tokenizer(core)


def fast_tokenizer(core: Any) -> Any:
    """A transformers tokenizer around a `tokenizers.Tokenizer` whose first three ids are
    <unk>, <s> and </s>, with a one-line chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
    )
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    return tok


def write_tiny_llama(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """Save a random tiny Llama (config.json, model.safetensors, tokenizer) and return the model."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(**overrides)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def write_sharded_llama(root: Path) -> Path:
    """A tiny Llama saved as many shards (about one per layer's half), with its index, in
    `root`/repo (and whole in `root`/single): a hub repository's layout. The repository."""
    model = write_tiny_llama(root / "single", hidden_size=128, intermediate_size=256)
    repo = root / "repo"
    model.save_pretrained(repo, max_shard_size="300KB")
    tiny_tokenizer().save_pretrained(repo)
    return repo


BYTES_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def tiny_bytes_tokenizer() -> Any:
    """Byte-level BPE without merges: one token per byte, so any text (JSON included) can be
    spelled, as structured output needs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tok.chat_template = BYTES_TEMPLATE
    return tok


def write_tiny_bytes_llama(folder: Path, seed: int = 0) -> None:
    """A random tiny Llama whose tokenizer spells bytes (see tiny_bytes_tokenizer)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(max_position_embeddings=1024)
    config._attn_implementation = "sdpa"
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tiny_bytes_tokenizer().save_pretrained(folder)


def member(
    name: str,
    span: tuple[int, int] | None = None,
    *,
    ms: float = 1.0,
    layers: int = 100,
    kv_free: int = 10**9,
    queue: int = 0,
    fixed_ms: float = 0.0,
    **fields: Any,
) -> MemberRecord:
    """A member record: node `name` at `name:7070`, incarnation 0, of a 30-layer model
    (`MODEL`), serving `span`; it runs one layer for one token in `ms` ms (a prompt's token
    in 4 x `ms`), and each step costs it `fixed_ms` more whatever its layers; its memory
    holds `layers` layers of 1000 bytes, `kv_free` bytes of its KV cache are free and `queue`
    jobs wait for its compute thread. `fields`: any other field of the record, as given
    (`incarnation=2`, `address="n1:7071"`, `draining=True`)."""
    record = MemberRecord(
        node_id=NodeId(name),
        address=f"{name}:7070",
        incarnation=0,
        model_id=MODEL,
        num_layers=30,
        capacity=Capacity(
            "cpu", "float32", layers * 1000, 1000, ms * 4, ms, ms_per_step_fixed=fixed_ms
        ),
        span=None if span is None else LayerSpan(*span),
        load=Load(queue_depth=queue, kv_free_bytes=kv_free),
    )
    return dataclasses.replace(record, **fields)


def plan_spans(plan: Plan) -> dict[str, tuple[int, int] | None]:
    """A plan's span per node as (start, end), as the tables write them."""
    return {node: None if s is None else (s.start, s.end) for node, s in plan.spans}
