"""A shard runs decoder layers [start, end) for many sessions, each with its own KV cache."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import torch

from swarm.config import RuntimeConfig
from swarm.errors import ActivationError, SpanError, SwarmError
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.positions import Rotary, StepInputs
from swarm.runtime.families import AttentionKind, Block, build_block
from swarm.runtime.kv_cache import KVCacheManager, KVShape, SessionKV
from swarm.runtime.weights import heap
from swarm.types import LayerSpan, SessionId

DecodeStep = tuple[SessionId, torch.Tensor, int]  # session, hidden [1, 1, hidden], position
PrefillStep = tuple[SessionId, torch.Tensor, int]  # session, hidden [1, seq, hidden], position


class Shard:
    def __init__(
        self, context: ModelContext, span: LayerSpan, blocks: list[Block], kv: KVCacheManager
    ) -> None:
        self.context = context
        self.span = span
        self.kv = kv
        self._blocks = blocks
        family = context.family
        self._rotary = Rotary(family, context.config, context.skeleton(), context.device)
        self._kinds = [context.attention(i) for i in span]
        self._explicit_masks = context.config._attn_implementation == "eager"

    @classmethod
    def load(
        cls,
        context: ModelContext,
        span: LayerSpan,
        runtime: RuntimeConfig,
        reuse: Shard | None = None,
        keep: bool = True,
    ) -> Shard:
        """Load layers [span.start, span.end): only their files are read, and none of the
        layers `reuse` (the shard this node serves now) already holds: those are shared.
        `keep=False` leaves layers not stored yet out of the store (a speed probe)."""
        span.check_within(context.num_layers)
        skeleton = context.skeleton()
        blocks: list[Block] = []
        for i in span:
            if reuse is not None and i in reuse.span:
                blocks.append(reuse.block(i))
                continue
            weights = context.to_runtime(context.store.load_layer(i, keep))
            blocks.append(build_block(context.config, skeleton, i, weights, context.int8))
            # what converting the layer freed goes back to the system once a layer, not once
            # a matrix (a 64-expert layer converts 192)
            heap.trim()
        config = context.config
        shape = KVShape(
            layers=tuple(span),
            kv_heads=int(
                getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            ),
            head_dim=context.head_dim,
            dtype=context.dtype,
            device=context.device,
        )
        kv = KVCacheManager(shape, runtime.kv_cache_bytes, runtime.session_idle_timeout_s)
        shard = cls(context, span, blocks, kv)
        _settle_loaded_objects()
        return shard

    @torch.inference_mode()
    def forward(
        self,
        session: SessionId,
        hidden: torch.Tensor,
        position: int,
        layers: LayerSpan | None = None,
    ) -> torch.Tensor:
        """Run `layers` (default: the whole span) on `hidden` [1, seq, hidden_size], positions
        [position, position + seq). A session keeps the layers of its first step.

        A position below the session's cache length rewinds the cache there (a replay)."""
        layers = self._check_layers(layers or self.span)
        hidden = self._check_hidden(hidden)
        seq = hidden.shape[1]
        cache = self._begin(session, position, seq, layers)
        position_ids = torch.arange(position, position + seq, device=self.context.device)
        blocks, kinds = self._layers(layers)
        step = StepInputs(
            self._rotary, kinds, hidden, position_ids.unsqueeze(0), position, self._explicit_masks
        )
        for block, kind in zip(blocks, kinds, strict=True):
            cos_sin, mask = step.for_layer(kind)
            hidden = block(hidden, cos_sin, mask, cache)
        cache.commit()
        return hidden

    @torch.inference_mode()
    def verify(
        self,
        session: SessionId,
        hidden: torch.Tensor,
        position: int,
        layers: LayerSpan | None = None,
    ) -> torch.Tensor:
        """Like `forward`, but every position computed as a one-position decode step of its
        own would be: a verify step's rows, whose logits must be the bits decoding would see
        (a prefill's products and attention round differently). On swarm's kernels the rows
        run together, one call per layer; elsewhere one step per row."""
        layers = self._check_layers(layers or self.span)
        hidden = self._check_hidden(hidden)
        seq = hidden.shape[1]
        blocks, kinds = self._layers(layers)
        end = position + seq
        unmasked = not self._explicit_masks and all(
            k.window is None or end <= k.window for k in kinds
        )
        cache = self._begin(session, position, seq, layers)
        together = unmasked and all(
            getattr(b, "decodes_rows_alone", None) is not None and b.decodes_rows_alone(cache)  # type: ignore[attr-defined]
            for b in blocks
        )
        if not together:
            cache.begin_step(position, 0)  # nothing written: the rows write their own steps
            steps = [
                self.forward(session, hidden[:, i : i + 1], position + i, layers)
                for i in range(seq)
            ]
            return torch.cat(steps, dim=1)
        # rows: [seq, 1, hidden], one decode position each
        rows = hidden.view(seq, 1, -1)
        position_ids = torch.arange(position, end, device=self.context.device).view(seq, 1)
        step = StepInputs(self._rotary, kinds, rows, position_ids, None, False)
        for block, kind in zip(blocks, kinds, strict=True):
            cos_sin, _ = step.for_layer(kind)
            rows = block.verify_rows(rows, cos_sin, cache)  # type: ignore[attr-defined]
        cache.commit()
        out: torch.Tensor = rows.view(1, seq, -1)
        return out

    def _layers(self, layers: LayerSpan) -> tuple[list[Block], list[AttentionKind]]:
        """The blocks of `layers` (checked to lie in the span) and their attention kinds."""
        first = layers.start - self.span.start
        end = first + len(layers)
        return self._blocks[first:end], self._kinds[first:end]

    def _begin(self, session: SessionId, position: int, seq: int, layers: LayerSpan) -> SessionKV:
        cache = self.kv.acquire(session, position, seq)
        if cache.layers is None or position == 0:
            cache.layers = layers
        elif cache.layers != layers:
            raise SpanError(f"session {session} runs layers {cache.layers} here, not {layers}")
        cache.begin_step(position, seq)
        return cache

    @torch.inference_mode()
    def decode_batch(
        self, steps: Sequence[DecodeStep], layers: LayerSpan
    ) -> list[torch.Tensor | SwarmError]:
        """One decode position for each of several sessions (distinct), all running `layers`,
        as one batched forward where the layers support it. Each step gets its own hidden
        state [1, 1, hidden_size] back, or the error that step alone hit."""
        layers = self._check_layers(layers)
        results: list[torch.Tensor | SwarmError] = []
        ready: list[tuple[int, SessionKV, torch.Tensor, int]] = []
        for i, (session, hidden, position) in enumerate(steps):
            try:
                hidden = self._check_hidden(hidden)
                if hidden.shape[1] != 1:
                    raise ActivationError("a batched decode step carries one position")
                ready.append((i, self._begin(session, position, 1, layers), hidden, position))
                results.append(hidden)  # replaced below
            except SwarmError as e:
                results.append(e)
        blocks, kinds = self._layers(layers)
        if not ready:
            return results
        # hidden: [sessions, 1, hidden_size]; position_ids: [sessions, 1]
        hidden = torch.cat([h for _, _, h, _ in ready])
        positions = [p for *_, p in ready]
        caches = [cache for _, cache, _, _ in ready]
        # a batched block sees every key: exact unless a window hides some of them
        unmasked = not self._explicit_masks and all(
            k.window is None or max(positions) < k.window for k in kinds
        )
        if len(ready) > 1 and unmasked and all(hasattr(b, "decode_batch") for b in blocks):
            position_ids = torch.tensor([[p] for p in positions], device=self.context.device)
            step = StepInputs(self._rotary, kinds, hidden, position_ids, None, False)
            for block, kind in zip(blocks, kinds, strict=True):
                cos_sin, _ = step.for_layer(kind)
                hidden = block.decode_batch(hidden, cos_sin, caches)  # type: ignore[attr-defined]
        else:  # one at a time, each on its own cache
            rows = []
            for j, cache in enumerate(caches):
                row = hidden[j : j + 1]
                position_ids = torch.tensor([[positions[j]]], device=self.context.device)
                step = StepInputs(
                    self._rotary, kinds, row, position_ids, positions[j], self._explicit_masks
                )
                for block, kind in zip(blocks, kinds, strict=True):
                    cos_sin, mask = step.for_layer(kind)
                    row = block(row, cos_sin, mask, cache)
                rows.append(row)
            hidden = torch.cat(rows)
        for j, (i, cache, _, _) in enumerate(ready):
            cache.commit()
            results[i] = hidden[j : j + 1]
        return results

    @torch.inference_mode()
    def prefill_batch(
        self, steps: Sequence[PrefillStep], layers: LayerSpan
    ) -> list[torch.Tensor | SwarmError]:
        """Prefill chunks of several sessions (distinct), all running `layers`, layer by layer
        in one call. Each session's output and cache are the bits its own `forward` gives: its
        rows meet the same operations on the same shapes, and a block's products take the
        rows of every session at once only where they compute each row alone (the block's
        `prefill_batch`). Each step gets its hidden states back, or the error it alone hit."""
        layers = self._check_layers(layers)
        results: list[torch.Tensor | SwarmError] = []
        ready: list[tuple[int, SessionKV, StepInputs]] = []
        hiddens: list[torch.Tensor] = []
        blocks, kinds = self._layers(layers)
        for i, (session, hidden, position) in enumerate(steps):
            try:
                hidden = self._check_hidden(hidden)
                seq = hidden.shape[1]
                cache = self._begin(session, position, seq, layers)
            except SwarmError as e:
                results.append(e)
                continue
            ids = torch.arange(position, position + seq, device=self.context.device)
            inputs = StepInputs(
                self._rotary, kinds, hidden, ids.unsqueeze(0), position, self._explicit_masks
            )
            ready.append((i, cache, inputs))
            hiddens.append(hidden)
            results.append(hidden)  # replaced below
        caches = [cache for _, cache, _ in ready]
        for block, kind in zip(blocks, kinds, strict=True):
            per_session = [inputs.for_layer(kind) for _, _, inputs in ready]
            batched = getattr(block, "prefill_batch", None)
            if batched is not None and len(ready) > 1:
                hiddens = batched(hiddens, per_session, caches)
            else:
                hiddens = [
                    block(h, cos_sin, mask, cache)
                    for h, (cos_sin, mask), cache in zip(hiddens, per_session, caches, strict=True)
                ]
        for (i, cache, _), hidden in zip(ready, hiddens, strict=True):
            cache.commit()
            results[i] = hidden
        return results

    def block(self, layer: int) -> Block:
        return self._blocks[layer - self.span.start]

    def _check_layers(self, layers: LayerSpan) -> LayerSpan:
        if layers.start < self.span.start or layers.end > self.span.end:
            raise SpanError(f"layers {layers} are not within this shard's span {self.span}")
        return layers

    def has_session(self, session: SessionId) -> bool:
        return session in self.kv

    def close_session(self, session: SessionId) -> bool:
        return self.kv.close(session)

    def _check_hidden(self, hidden: Any) -> torch.Tensor:
        size = self.context.hidden_size
        if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point():
            raise ActivationError("hidden states must be a floating-point tensor")
        if (
            hidden.dim() != 3
            or hidden.shape[0] != 1
            or hidden.shape[2] != size
            or hidden.shape[1] < 1
        ):
            raise ActivationError(
                f"hidden states must have shape [1, seq>=1, {size}], not {list(hidden.shape)}"
            )
        return hidden.to(device=self.context.device, dtype=self.context.dtype)


def _settle_loaded_objects() -> None:
    """Take what a load built out of the cyclic collector's view. A model's layers are tens of
    thousands of long-lived Python objects (a 48-layer, 64-expert model ~100k), and every full
    collection, which a decode step's short-lived objects set off every few steps, walked them
    all: 15% of such a model's decode step (59 to 51 ms a step). Unfrozen and collected first,
    so that what a move dropped since the last load is still freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
