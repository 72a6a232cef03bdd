"""A fault for tests: one byte of one layer's weights flipped in memory after load
(runtime.test_flip_byte), so a node computes fluent, wrong text the way a machine with bad
memory would, and a test can see the spot-checks (swarm/inference/spot_checks.py) find it."""

from __future__ import annotations

import dataclasses
import logging

import torch

from swarm.errors import ConfigError
from swarm.runtime.weights.packed import PackedTensor, Source

log = logging.getLogger(__name__)


def flip_byte(weights: dict[str, Source], offset: int, layer: int) -> dict[str, Source]:
    """`weights` with every bit of the byte at `offset` inverted, counting through the
    tensors' bytes laid end to end in name order; the tensor that holds it is copied first
    (the others, and whatever file they map, are left as they are). ConfigError when the
    layer has fewer bytes."""
    at = offset
    for name in sorted(weights):
        tensor = weights[name]
        data = tensor.data if isinstance(tensor, PackedTensor) else tensor
        size = data.numel() * data.element_size()
        if at >= size:
            at -= size
            continue
        copy = data.detach().clone().contiguous()
        raw = copy.view(-1).view(torch.uint8)  # the same memory, byte by byte
        raw[at] = 255 - int(raw[at])
        log.warning(
            "TEST ONLY: flipped byte %d of layer %d (byte %d of %s)", offset, layer, at, name
        )
        flipped = dict(weights)
        flipped[name] = (
            dataclasses.replace(tensor, data=copy) if isinstance(tensor, PackedTensor) else copy
        )
        return flipped
    raise ConfigError(
        f"runtime.test_flip_byte: offset {offset} is past layer {layer}'s {offset - at} bytes"
    )
