"""What every part of the runtime shares about one model: its store, config, dtype and device."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from swarm.config import RuntimeConfig
from swarm.errors import ConfigError
from swarm.runtime.checkpoint.layout import build_skeleton
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.families import AttentionKind, Family, family_for
from swarm.runtime.weights import native, on_gpu
from swarm.runtime.weights.native import KernelSwitches
from swarm.runtime.weights.packed import Source, to_device

log = logging.getLogger(__name__)

# runtime.dtype -> the dtype of activations, KV caches and every float weight. int8 quantizes
# the decoder layers' matrices and keeps the rest (and the residual stream) in float32; packed
# runs GGUF's quantized matrices as they are stored (swarm.runtime.weights.packed), likewise
# in float32.
_DTYPES = {
    "packed": torch.float32,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.float32,
}


@dataclass(frozen=True)
class ModelContext:
    store: ModelStore
    config: Any  # transformers PretrainedConfig, with the attention its family runs
    dtype: torch.dtype  # activations, KV caches and float weights
    device: torch.device
    int8: bool = False  # decoder-layer matrices held as int8 (swarm.runtime.weights.quant)
    packed: bool = False  # GGUF matrices run from their blocks; otherwise dequantized at load

    @classmethod
    def open(cls, runtime: RuntimeConfig, progress: bool = True) -> ModelContext:
        store = ModelStore.open(runtime.model, runtime.cache_dir, progress=progress)
        config = store.load_config()
        config._attn_implementation = family_for(config).attn_implementation(config)
        if runtime.device == "cuda" and not torch.cuda.is_available():
            why = (
                f"this torch ({torch.__version__}) is built without CUDA"
                if torch.version.cuda is None
                else "it sees no CUDA device (driver, CUDA_VISIBLE_DEVICES)"
            )
            raise ConfigError(
                f"runtime.device is cuda, but torch finds no CUDA device: {why}; "
                "run with --device cpu, or install a CUDA build of torch"
            )
        if runtime.threads:
            torch.set_num_threads(runtime.threads)
        native.configure(
            KernelSwitches(
                native=runtime.native_kernels,
                avx512=runtime.avx512_kernels,
                native_attention=runtime.native_attention,
                dense_layers=runtime.dense_layers,
            )
        )
        return cls(
            store,
            config,
            _DTYPES[runtime.dtype],
            torch.device(runtime.device),
            int8=runtime.dtype == "int8",
            packed=runtime.dtype == "packed",
        )

    @property
    def num_layers(self) -> int:
        return self.store.num_layers

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def head_dim(self) -> int:
        c = self.config
        return int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)

    def skeleton(self) -> torch.nn.Module:
        """A fresh meta-device model to take module classes from; each user materializes its own."""
        return build_skeleton(self.config)

    @property
    def family(self) -> Family:
        return family_for(self.config)

    def attention(self, layer: int) -> AttentionKind:
        return self.family.attention(self.config, layer)

    def to_runtime(
        self, tensors: dict[str, Source], device: torch.device | None = None
    ) -> dict[str, Source]:
        """`tensors` as the layers run them on `device` (default: the node's)."""
        device = device or self.device
        note = on_gpu.load_note(tensors, device) if self.packed else None
        if note:
            log.info(note)
        return {k: to_device(v, device, self.dtype, self.packed) for k, v in tensors.items()}
