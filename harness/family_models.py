"""Tiny seeded random models of every supported family, built from the family's own
transformers config class, written both as a Hugging Face folder and as a GGUF file (with the
`gguf` package's writer, transformed the way llama.cpp's converter writes each family)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.factories import TINY_VOCAB, fast_tokenizer

WINDOW = 16  # sliding window of the families that have one
PROMPT = [1, *range(10, 49)]  # 40 positions: the prefill alone crosses the sliding window
NEW_TOKENS = 28  # 68 positions in all: more than four sliding windows
FORMATS = ("hf", "gguf")


def family_formats() -> list[tuple[str, str]]:
    """(family, format) of every checkpoint the family tests build."""
    return [(name, fmt) for name in sorted(SPECS) for fmt in SPECS[name].formats]


@dataclass(frozen=True)
class FamilySpec:
    name: str  # swarm's family name
    config_class: str  # transformers config class
    model_class: str  # transformers ForCausalLM class
    arch: str  # GGUF general.architecture
    layers: int = 4
    split: str = "0:1,1:3,3:4"  # three hops
    window: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    formats: tuple[str, ...] = FORMATS  # the checkpoint formats swarm reads for the family


# Gemma ties its head to the embedding (llama.cpp writes no output tensor for it)
_GEMMA = dict(
    head_dim=16,
    query_pre_attn_scalar=16,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
)

SPECS = {
    s.name: s
    for s in (
        FamilySpec(
            "llama",
            "LlamaConfig",
            "LlamaForCausalLM",
            "llama",
            overrides=dict(
                # Llama-3 scaling; a low base and a short original context make it move
                # frequencies that turn within the test's positions, so a lost scaling shows
                rope_parameters=dict(
                    rope_type="llama3",
                    rope_theta=100.0,
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=32,
                )
            ),
        ),
        FamilySpec(
            "mistral",
            "MistralConfig",
            "MistralForCausalLM",
            "llama",
            window=WINDOW,
            overrides=dict(sliding_window=WINDOW, head_dim=16),
        ),
        FamilySpec("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "qwen2"),
        FamilySpec("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", overrides={"head_dim": 16}),
        FamilySpec(
            "gemma2",
            "Gemma2Config",
            "Gemma2ForCausalLM",
            "gemma2",
            window=WINDOW,
            overrides=dict(
                _GEMMA,
                sliding_window=WINDOW,
                final_logit_softcapping=30.0,
                attn_logit_softcapping=50.0,
            ),
        ),
        FamilySpec(
            "gemma3",
            "Gemma3TextConfig",
            "Gemma3ForCausalLM",
            "gemma3",
            layers=6,  # five sliding layers, then a full one
            split="0:2,2:5,5:6",
            window=WINDOW,
            overrides=dict(_GEMMA, sliding_window=WINDOW),
        ),
        FamilySpec(
            "qwen3_moe",
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            "qwen3moe",
            overrides=dict(
                head_dim=16,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                norm_topk_prob=True,  # as Qwen3-MoE's checkpoints (and llama.cpp) have it
            ),
        ),
        FamilySpec(
            "mixtral",
            "MixtralConfig",
            "MixtralForCausalLM",
            "llama",  # llama.cpp writes Mixtral as llama with experts
            overrides=dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2),
        ),
        FamilySpec(
            "gpt_oss",
            "GptOssConfig",
            "GptOssForCausalLM",
            "gpt-oss",
            window=WINDOW,  # sliding and full layers alternating, YaRN rotary
            overrides=dict(
                head_dim=16,
                sliding_window=WINDOW,
                num_local_experts=4,
                num_experts_per_tok=2,
                intermediate_size=32,
                # YaRN over a short original context: it moves frequencies within the test
                rope_parameters=dict(
                    rope_type="yarn",
                    rope_theta=150000.0,
                    factor=16.0,
                    beta_fast=32.0,
                    beta_slow=1.0,
                    truncate=False,
                    original_max_position_embeddings=32,
                ),
            ),
        ),
        FamilySpec(
            "phi3",
            "Phi3Config",
            "Phi3ForCausalLM",
            "phi3",
            window=WINDOW,
            overrides=dict(sliding_window=WINDOW, pad_token_id=0),
        ),
    )
}


def family_config(spec: FamilySpec) -> Any:
    import transformers

    values: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=2**-17,  # exact in float32, as GGUF stores it
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        # large enough that attention is far from uniform: positions (rotary, windows) matter
        initializer_range=0.2,
    )
    values.update(spec.overrides)
    return getattr(transformers, spec.config_class)(**values)


def build_model(spec: FamilySpec, seed: int = 0) -> Any:
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(family_config(spec)).eval()
    with torch.no_grad():  # random norms, so a norm stored with an offset shows if mishandled;
        # on a grid of 2**-8, so storing w + 1 in float32 (Gemma's GGUF) loses no bits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_((param.normal_(0.0, 0.5) * 256).round() / 256)
    return model


def write_folder(model: Any, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    family_tokenizer().save_pretrained(folder)
    return folder


def family_tokenizer() -> Any:
    """The byte-level BPE the GGUF files carry, for the HF folders, with a chat template: a
    text has the same ids in both formats. (A word-level tokenizer would not do: transformers
    swaps in its Qwen2 tokenizer class for a qwen2 folder, which encodes it to nothing.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = _byte_vocab()
    pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges)]
    vocab = {token: i for i, token in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return fast_tokenizer(core)


def _byte_vocab() -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary of TINY_VOCAB tokens: specials, the 256 byte symbols, and
    merged pairs of lowercase letters; and its merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    specials = ["<unk>", "<s>", "</s>"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [(a, b) for a in letters for b in letters][: TINY_VOCAB - len(specials) - 256]
    return specials + alphabet + [a + b for a, b in pairs], [f"{a} {b}" for a, b in pairs]


def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """The q/k row order llama.cpp writes for the llama architecture."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _llama3_rope_factors(config: Any) -> np.ndarray:
    """llama.cpp's rope_freqs tensor for Llama-3 scaling: a divisor per frequency."""
    rope = config.rope_parameters
    dim = config.head_dim
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(
    model: Any,
    spec: FamilySpec,
    path: Path,
    strings: dict[str, str] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
    expert_type: str = "F32",
    expert_per_tensor: bool = False,
) -> Path:
    """`strings` and `tensors`: extra metadata and tensors, to write files swarm must refuse;
    `expert_type`: the GGUF type the experts are stored in (`expert_blocks`);
    `expert_per_tensor`: each expert a 2-D tensor of its own (llama.cpp's first Mixtral files,
    blk.N.ffn_gate.E.weight), not one 3-D tensor per projection."""
    import gguf

    config = model.config
    arch = spec.arch
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{spec.name}")  # transformers reads "mistral" in the name as Mistral
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    if spec.window:
        writer.add_sliding_window(spec.window)
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None) and arch == "gemma2":
            getattr(writer, f"add_{key}")(float(getattr(config, key)))
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    tokens, merges = _byte_vocab()
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (TINY_VOCAB - 3))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(0)
    _add_experts_metadata(writer, config)
    for key, value in (strings or {}).items():
        writer.add_string(key, value)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().to(torch.float32).numpy().copy()
        base, _, suffix = hf_name.rpartition(".")
        if base.endswith("mlp.experts"):
            layer = f"blk.{hf_name.split('.')[2]}"
            for name, part in _expert_tensors(layer, suffix, data, arch == "gpt-oss"):
                blocks, raw_type = (
                    (part, None) if part.ndim < 3 else expert_blocks(part, expert_type)
                )
                if expert_per_tensor:
                    for e, one in enumerate(blocks):
                        writer.add_tensor(name.replace("_exps.", f".{e}."), one, raw_dtype=raw_type)
                else:
                    writer.add_tensor(name, blocks, raw_dtype=raw_type)
            continue
        if suffix == "sinks":  # gpt-oss: one per head
            writer.add_tensor(f"{names.get_name(hf_name)}.weight", data)
            continue
        gguf_name = names.get_name(base)
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {hf_name}")
        if arch == "llama" and base.endswith("q_proj"):
            data = _llama_permute(data, config.num_attention_heads)
        if arch == "llama" and base.endswith("k_proj"):
            data = _llama_permute(data, config.num_key_value_heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + 1  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
        writer.add_tensor(f"{gguf_name}.{suffix}", data)
    if (rope.get("rope_type")) == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_rope_factors(config))
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_experts_metadata(writer: Any, config: Any) -> None:
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        return
    writer.add_expert_count(int(experts))
    writer.add_expert_used_count(int(config.num_experts_per_tok))
    inner = getattr(config, "moe_intermediate_size", None)
    if config.model_type == "gpt_oss":
        inner = config.intermediate_size
    if inner:
        writer.add_expert_feed_forward_length(int(inner))


def _expert_tensors(
    layer: str, suffix: str, data: np.ndarray, gpt_oss: bool
) -> list[tuple[str, np.ndarray]]:
    """transformers' 3-D experts as llama.cpp writes them: gate and up apart, each
    [experts, rows, cols] (and biases [experts, rows]); `layer` is the GGUF prefix blk.N.
    gpt-oss keeps x @ W matrices with gate and up interleaved: transposed, de-interleaved."""
    if gpt_oss and data.ndim == 3:
        data = data.swapaxes(1, 2)
    kind = "bias" if suffix.endswith("_bias") else "weight"
    if suffix.startswith("gate_up_proj"):
        if gpt_oss:
            gate, up = data[:, 0::2], data[:, 1::2]
        else:
            gate, up = np.split(data, 2, axis=1)
        return [
            (f"{layer}.ffn_gate_exps.{kind}", np.ascontiguousarray(gate)),
            (f"{layer}.ffn_up_exps.{kind}", np.ascontiguousarray(up)),
        ]
    if suffix.startswith("down_proj"):
        return [(f"{layer}.ffn_down_exps.{kind}", np.ascontiguousarray(data))]
    raise ValueError(f"no GGUF name for experts' {suffix}")


def expert_blocks(experts: np.ndarray, qtype: str) -> tuple[np.ndarray, Any]:
    """float [experts, rows, cols] as GGUF stores them in `qtype`, and the writer's raw type
    (None for F32): the `gguf` package's quantizer, or tests.kquants' for Q4_K and Q6_K."""
    import gguf

    from harness.kquants import quantize_q4_k, quantize_q6_k

    if qtype in ("F32", "F16"):  # the writer takes these as numpy arrays
        return experts.astype(np.float32 if qtype == "F32" else np.float16), None
    kind = gguf.GGMLQuantizationType[qtype]
    flat = experts.reshape(-1, experts.shape[-1])
    packers = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
    blocks = packers[qtype](flat) if qtype in packers else gguf.quants.quantize(flat, kind)
    return blocks.reshape(*experts.shape[:-1], -1), kind


def dequantized_experts(experts: np.ndarray, qtype: str) -> np.ndarray:
    """What a file of `expert_blocks(experts, qtype)` holds, in float32."""
    import gguf

    blocks, kind = expert_blocks(experts, qtype)
    if kind is None:
        return blocks.astype(np.float32)
    return gguf.quants.dequantize(blocks, kind).astype(np.float32)


@dataclass(frozen=True)
class Checkpoint:
    spec: FamilySpec
    model: Any  # the transformers model the file was written from
    path: Path  # the HF folder or the .gguf file
    expected: list[int]  # transformers' greedy tokens after PROMPT
    logits: torch.Tensor  # transformers' logits [vocab] for the last position of PROMPT


def gguf_spec(spec: FamilySpec) -> FamilySpec:
    """A Mistral GGUF is a llama-architecture file, which carries no sliding window: the
    GGUF checkpoint of Mistral is a window-less Mistral (as v0.2 and later are)."""
    if spec.name != "mistral":
        return spec
    overrides = {**spec.overrides, "sliding_window": None}
    return dataclasses.replace(spec, window=None, overrides=overrides)


def reference_tokens(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy `generate`, without the end-of-sequence token."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
        )
    eos = model.generation_config.eos_token_id
    return [t for t in out[0, len(prompt) :].tolist() if t != eos]


def _checkpoint(model: Any, spec: FamilySpec, path: Path) -> Checkpoint:
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT])).logits[0, -1].float()
    return Checkpoint(spec, model, path, reference_tokens(model, PROMPT, NEW_TOKENS), logits)


def build_checkpoints(root: Path) -> dict[tuple[str, str], Checkpoint]:
    """Each family's tiny model in both formats, with transformers' answers."""
    built: dict[tuple[str, str], Checkpoint] = {}
    for name, spec in SPECS.items():
        model = build_model(spec)
        built[name, "hf"] = _checkpoint(model, spec, write_folder(model, root / name / "hf"))
        if "gguf" not in spec.formats:
            continue
        used = gguf_spec(spec)
        if used is not spec:
            model = build_model(used)
        path = write_gguf(model, used, root / name / f"{name}.gguf")
        built[name, "gguf"] = (
            dataclasses.replace(built[name, "hf"], path=path)
            if used is spec
            else _checkpoint(model, used, path)
        )
    return built
