"""The store's split of parameter names into parts follows the family's `SkeletonPaths`: paths
of a module tree that is not Llama's (made up, and GPT-NeoX's) split into the same parts."""

from __future__ import annotations

import pytest

from swarm.errors import ModelError
from swarm.runtime.checkpoint.layout import EMBED, HEAD, layer_part, layout_from_config, split_name
from swarm.runtime.families import SkeletonPaths

NEOX = SkeletonPaths(
    embedding="gpt_neox.embed_in",
    layers="gpt_neox.layers",
    norm="gpt_neox.final_layer_norm",
    head="lm_head",
    rotary="gpt_neox.rotary_emb",
)
MADE_UP = SkeletonPaths(embedding="wte", layers="blocks.h", norm="ln_f", head="out")


@pytest.mark.parametrize(
    ("paths", "hf_name", "where"),
    [
        (
            SkeletonPaths(),
            "model.layers.3.self_attn.q_proj.weight",
            (layer_part(3), "self_attn.q_proj.weight"),
        ),
        (SkeletonPaths(), "model.embed_tokens.weight", (EMBED, "embed_tokens.weight")),
        (SkeletonPaths(), "model.norm.weight", (HEAD, "norm.weight")),
        (SkeletonPaths(), "lm_head.weight", (HEAD, "lm_head.weight")),
        (SkeletonPaths(), "gpt_neox.layers.0.mlp.dense_h_to_4h.weight", None),
        (NEOX, "gpt_neox.layers.12.attention.dense.bias", (layer_part(12), "attention.dense.bias")),
        (NEOX, "gpt_neox.embed_in.weight", (EMBED, "embed_tokens.weight")),
        (NEOX, "gpt_neox.final_layer_norm.bias", (HEAD, "norm.bias")),
        (NEOX, "lm_head.weight", (HEAD, "lm_head.weight")),
        (MADE_UP, "wte.weight", (EMBED, "embed_tokens.weight")),
        (MADE_UP, "blocks.h.7.attn.c_attn.weight", (layer_part(7), "attn.c_attn.weight")),
        (MADE_UP, "ln_f.weight", (HEAD, "norm.weight")),
        (MADE_UP, "out.weight", (HEAD, "lm_head.weight")),
        (MADE_UP, "lm_head.weight", None),
        (NEOX, "gpt_neox.layers.x.attention.dense.bias", None),
        (NEOX, "gpt_neox.layers.1", None),
        (NEOX, "model.layers.0.mlp.up_proj.weight", None),
        (MADE_UP, "outer.weight", None),  # a prefix of a name is not its module
    ],
)
def test_names_split_by_the_family_paths(
    paths: SkeletonPaths, hf_name: str, where: tuple[str, str] | None
) -> None:
    assert split_name(hf_name, paths) == where


def _neox_config():  # type: ignore[no-untyped-def]
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        tie_word_embeddings=False,
    )


def test_a_tree_unlike_llama_splits_into_the_same_parts() -> None:
    layout = layout_from_config(_neox_config(), NEOX)
    assert layout.num_layers == 3
    assert sorted(layout.parts) == sorted([EMBED, HEAD, *layout.layer_parts()])
    assert layout.parts[EMBED] == {"embed_tokens.weight": (64, 32)}
    assert layout.parts[HEAD] == {
        "norm.weight": (32,),
        "norm.bias": (32,),
        "lm_head.weight": (64, 32),
    }
    layer = layout.parts[layer_part(2)]
    assert layer["attention.dense.weight"] == (32, 32)
    assert layout.parts[layer_part(0)] == layer  # names inside a layer do not carry its index


def test_the_wrong_paths_name_what_they_expected() -> None:
    with pytest.raises(ModelError, match=r"gpt_neox\.embed_in\.weight.*\(model\.layers\.N\)"):
        layout_from_config(_neox_config(), SkeletonPaths())


def test_a_block_takes_its_layer_from_the_family_paths() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(_neox_config())
    assert NEOX.layer(skeleton, 1) is skeleton.gpt_neox.layers[1]
    with pytest.raises(ModelError, match=r"gpt_neox\.embed_in is not a list of decoder layers"):
        SkeletonPaths(layers="gpt_neox.embed_in").layer(skeleton, 0)
