"""The correctness contract on the real model: greedy output through the runtime, whole or
split, is exactly what transformers' own generate produces on the same weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.reference import NEW_TOKENS, PROMPTS, generate_locally
from swarm.config import RuntimeConfig
from swarm.runtime.checkpoint.source import resolve_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_model() -> Any:
    from transformers import AutoModelForCausalLM

    source = resolve_model("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(
        str(source.path.parent), gguf_file=source.path.name, dtype=torch.float32
    )
    return model.eval()


async def _runtime_tokens(runtime: RuntimeConfig, split: str | None) -> list[list[int]]:
    results = await generate_locally(runtime, PROMPTS, NEW_TOKENS, split)
    for result in results:
        assert result.completion_tokens == len(result.token_ids)
    return [result.token_ids for result in results]


def _reference_tokens(model: Any, runtime: RuntimeConfig) -> list[list[int]]:
    from swarm.runtime.checkpoint.store import ModelStore
    from swarm.runtime.text.tokenizer import load_tokenizer

    store = ModelStore.open(runtime.model, runtime.cache_dir)
    tokenizer = load_tokenizer(store.tokenizer_folder)
    eos = model.generation_config.eos_token_id
    results = []
    for prompt in PROMPTS:
        chat = [{"role": "user", "content": prompt}]
        ids = torch.tensor([tokenizer.chat_ids(chat, {})])
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
            )
        new = out[0, ids.shape[1] :].tolist()
        results.append([t for t in new if t != eos])
    return results


async def test_runtime_matches_transformers_generate(
    hf_model: Any, smol_runtime: RuntimeConfig
) -> None:
    expected = _reference_tokens(hf_model, smol_runtime)
    assert all(len(t) >= 16 for t in expected)  # the prompts really generate
    whole = await _runtime_tokens(smol_runtime, None)
    split = await _runtime_tokens(smol_runtime, "0:10,10:20,20:30")
    for prompt, exp, got_whole, got_split in zip(PROMPTS, expected, whole, split, strict=True):
        assert got_whole == exp, prompt
        assert got_split == exp, prompt
