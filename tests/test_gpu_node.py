"""A node that is part GPU, part CPU: how many layers the device holds (a table), the byte
sizes its flag takes, what reads as a throttling GPU, and the split path itself, run with
both groups on the CPU (the stand-in): two groups, the hidden states crossing between them,
KV on both, and the same greedy text as one group."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.reference import PROMPTS, generate_locally
from swarm.config import RuntimeConfig, parse_bytes
from swarm.errors import ConfigError
from swarm.runtime.execution.devices import (
    CPU,
    activation_bytes,
    cap_holding,
    param_bytes,
    placement,
)
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.gpu.share import device_layers, throttling
from swarm.telemetry import layer_memory
from swarm.types import Health, LayerSpan, SessionId

MIB = 2**20


@pytest.mark.parametrize(
    ("layers", "layer_bytes", "kv", "cap", "reserve", "held"),
    [
        (30, 10 * MIB, 2 * MIB, 0, 0, 0),  # no room at all
        (30, 10 * MIB, 2 * MIB, 12 * MIB, 0, 1),  # exactly one layer with its KV
        (30, 10 * MIB, 2 * MIB, 12 * MIB - 1, 0, 0),  # a byte short of one
        (30, 10 * MIB, 2 * MIB, 13 * MIB, 2 * MIB, 0),  # the activations take the room
        (30, 10 * MIB, 2 * MIB, 122 * MIB, 2 * MIB, 10),  # ten with room for a prefill
        (30, 10 * MIB, 0, 10_000 * MIB, 0, 30),  # a big GPU holds the span, no more
        (8, 10 * MIB, 2 * MIB, 5 * MIB, 6 * MIB, 0),  # a reserve above the cap
        (0, 10 * MIB, 2 * MIB, 100 * MIB, 0, 0),  # an empty span
    ],
)
def test_device_layers(
    layers: int, layer_bytes: int, kv: int, cap: int, reserve: int, held: int
) -> None:
    assert device_layers(layers, layer_bytes, kv, cap, reserve) == held


ROWS, COLS = 4096, 4096


@pytest.mark.parametrize(
    ("qtype", "halves", "nbytes"),
    [
        ("Q4_K", False, ROWS * COLS // 256 * 144),  # blocks as stored
        ("Q4_K", True, ROWS * COLS // 256 * 144),  # a GPU kernel runs them as stored
        ("IQ2_XXS", False, ROWS * COLS // 256 * 66),  # the CPU's kernels run every type
        ("IQ2_XXS", True, 2 * ROWS * COLS),  # no GPU kernel: float16 at load, ~7.8x
        (None, True, 4 * ROWS * COLS),  # a float matrix in float32
    ],
)
def test_a_type_without_a_gpu_kernel_counts_as_float16_there(
    qtype: str | None, halves: bool, nbytes: int
) -> None:
    assert param_bytes(qtype, (ROWS, COLS), 4, False, halves) == nbytes


def test_a_cap_that_holds_the_blocks_may_not_hold_them_as_float16() -> None:
    """A --gpu-only node of such a type: the layer fits as stored, not as float16, so
    it holds no layer and refuses to start (`placement` names the types in its line)."""
    stored = param_bytes("IQ2_XXS", (ROWS, COLS), 4, False, False)
    cap = 4 * stored
    assert device_layers(1, stored, 0, cap, 0) == 1
    assert device_layers(1, param_bytes("IQ2_XXS", (ROWS, COLS), 4, False, True), 0, cap, 0) == 0


@pytest.mark.parametrize(
    ("health", "why"),
    [
        (Health(), None),  # no GPU
        (Health(gpu_temperature_c=70.0, gpu_throttle_reasons=0), None),
        (Health(gpu_temperature_c=84.9), None),
        (Health(gpu_temperature_c=85.0), "hot (85 C)"),
        (Health(gpu_temperature_c=70.0, gpu_throttle_reasons=0x1), None),  # idle clocks
        (Health(gpu_temperature_c=70.0, gpu_throttle_reasons=0x2 | 0x10), None),
        (Health(gpu_temperature_c=70.0, gpu_throttle_reasons=0x4), "power cap"),
        (
            Health(gpu_temperature_c=92.4, gpu_throttle_reasons=0x20 | 0x40),
            "hot (92 C), thermal (software), thermal (hardware)",
        ),
        (Health(gpu_throttle_reasons=0x8 | 0x80), "hardware slowdown, power brake"),
    ],
)
def test_throttling(health: Health, why: str | None) -> None:
    assert throttling(health) == why


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ("0", 0),
        ("1234", 1234),
        ("24GiB", 24 * 2**30),
        ("512 MB", 512_000_000),
        ("1.5g", 1_500_000_000),
        ("8kib", 8192),
        ("3TB", 3 * 10**12),
    ],
)
def test_sizes_take_units(raw: str, size: int) -> None:
    assert parse_bytes("runtime.gpu_memory_bytes", raw) == size


@pytest.mark.parametrize("raw", ["lots", "12 parsecs", "-1GiB", "GiB", "nan", "1e999"])
def test_a_size_that_is_no_size_is_named(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.gpu_memory_bytes"):
        parse_bytes("runtime.gpu_memory_bytes", raw)


def _capped(runtime: RuntimeConfig, context: ModelContext, layers: int, span: int) -> RuntimeConfig:
    """`runtime` with a device cap that holds exactly `layers` of a `span`-layer span."""
    return dataclasses.replace(
        runtime, gpu_memory_bytes=cap_holding(context, runtime, layers, span)
    )


@pytest.fixture(scope="module")
def smol_context(smol_packed: RuntimeConfig) -> ModelContext:
    return ModelContext.open(smol_packed, progress=False)


def test_a_cap_splits_the_span_and_counts_in_the_capacity(
    smol_packed: RuntimeConfig, smol_context: ModelContext
) -> None:
    span = LayerSpan(0, smol_context.num_layers)
    capped = _capped(smol_packed, smol_context, 12, len(span))
    assert placement(smol_context, span, capped).held == 12
    assert placement(smol_context, span, smol_packed).held == len(span)  # no cap: one group
    ram = dataclasses.replace(capped, layer_memory_bytes=7 * MIB)
    assert layer_memory(ram, CPU) == capped.gpu_memory_bytes + 7 * MIB  # VRAM plus RAM
    only = dataclasses.replace(ram, gpu_only=True)
    assert layer_memory(only, CPU) == capped.gpu_memory_bytes
    with pytest.raises(ConfigError, match=r"--gpu-only: .* holds 12 of the 30 layers"):
        placement(smol_context, span, only)
    tiny = dataclasses.replace(only, gpu_memory_bytes=activation_bytes(smol_context, only) + 1)
    with pytest.raises(ConfigError, match="holds not one layer"):
        placement(smol_context, span, tiny)


def test_two_groups_compute_what_one_does_with_kv_on_both(
    smol_packed: RuntimeConfig, smol_context: ModelContext
) -> None:
    span = LayerSpan(2, 10)
    capped = _capped(smol_packed, smol_context, 3, len(span))
    one = Shard.load(smol_context, span, smol_packed, keep=False)
    two = Shard.load(smol_context, span, capped, keep=False)
    assert (one.placement.held, two.placement.held) == (8, 3)
    session = SessionId("split")
    hidden = torch.randn(1, 9, smol_context.hidden_size, generator=torch.Generator().manual_seed(1))
    for shard in (one, two):
        shard.forward(session, hidden[:, :7], 0)
    # a prefill through both groups, then a decode row and a verify step crossing from a
    # point inside the device group, from the same caches
    assert torch.equal(
        one.forward(session, hidden[:, 7:8], 7), two.forward(session, hidden[:, 7:8], 7)
    )
    inner = LayerSpan(3, 10)
    for shard in (one, two):
        shard.forward(SessionId("inner"), hidden, 0, inner)
    assert torch.equal(
        one.decode_batch([(SessionId("inner"), hidden[:, :1], 9)], inner)[0],
        two.decode_batch([(SessionId("inner"), hidden[:, :1], 9)], inner)[0],
    )
    kept = two.kv.get(session).block(0, 8, span)  # every layer's keys, both groups'
    assert all(k.abs().sum() > 0 for k in kept.keys)


async def test_a_split_node_gives_the_text_one_group_gives(
    smol_packed: RuntimeConfig, smol_context: ModelContext
) -> None:
    capped = _capped(smol_packed, smol_context, 11, smol_context.num_layers)
    whole = await generate_locally(smol_packed, PROMPTS[:2], 16)
    split = await generate_locally(capped, PROMPTS[:2], 16)
    assert [g.text for g in split] == [g.text for g in whole]
    assert all(g.completion_tokens == 16 for g in split)
