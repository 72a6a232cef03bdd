"""A shard runs decoder layers [start, end) for many sessions, each with its own KV cache."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarm.config import RuntimeConfig
from swarm.errors import ActivationError, SpanError, SwarmError
from swarm.runtime.execution.devices import CPU, Placement, placement
from swarm.runtime.execution.faults import flip_byte
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.positions import Rotary, StepInputs
from swarm.runtime.families import AttentionKind, BatchedBlock, Block, build_block
from swarm.runtime.gpu.device import accelerator
from swarm.runtime.kv_cache import KVCacheManager, KVShape, SessionKV
from swarm.runtime.prefix_blocks import carried
from swarm.runtime.weights import heap
from swarm.types import LayerSpan, SessionId

# session, hidden [1, rows, hidden], the first row's position: one decode position per row
# (a decode step's one, a verify step's last accepted token and its drafts)
DecodeStep = tuple[SessionId, torch.Tensor, int]
PrefillStep = tuple[SessionId, torch.Tensor, int]  # session, hidden [1, seq, hidden], position


@dataclass(frozen=True)
class DecodeRun:
    """What one `Shard.decode_rows` call gave."""

    outputs: list[torch.Tensor | SwarmError]  # per step: hidden [1, rows, hidden], or its error
    # every row went through each layer in one call, so the call took what that many rows cost
    # (the decode pace's cost model); False where rows ran one after the other
    shared: bool


@dataclass(frozen=True)
class _Run:
    """Consecutive layers of one call in one group: a node that is part GPU runs its GPU
    group's, then its CPU group's, the hidden states crossing between them."""

    device: torch.device
    rotary: Rotary  # the group's tables, on `device`
    first: int  # the run's blocks are the shard's [first, end)
    end: int


@dataclass(eq=False)  # compared by identity: a step is in a group or not
class _Began:
    """A step of `decode_rows` whose cache took its positions."""

    index: int  # in the call's steps
    cache: SessionKV
    hidden: torch.Tensor  # [1, rows, hidden]
    position: int

    @property
    def rows(self) -> int:
        return self.hidden.shape[1]


class Shard:
    def __init__(
        self,
        context: ModelContext,
        span: LayerSpan,
        blocks: list[Block],
        kv: KVCacheManager,
        placement: Placement | None = None,  # default: every layer on context.device
    ) -> None:
        self.context = context
        self.span = span
        self.kv = kv
        self._blocks = blocks
        self.placement = placement or Placement.whole(context.device, len(span))
        skeleton = context.skeleton()
        devices = [self.placement.device, CPU][: 1 + (self.placement.held < len(span))]
        self._rotaries = [Rotary(context.family, context.config, skeleton, d) for d in devices]
        self._accelerators = [accelerator(d) for d in devices]
        self._kinds = [context.attention(i) for i in span]
        self._explicit_masks = context.config._attn_implementation == "eager"
        # where every block runs decode positions of several sessions in one call: the
        # blocks as such (checked once here, not per step)
        self._batched_blocks: list[BatchedBlock] | None = (
            [b for b in blocks if isinstance(b, BatchedBlock)]
            if all(isinstance(b, BatchedBlock) for b in blocks)
            else None
        )

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
        where = placement(context, span, runtime)  # refuses a cap too small, up front
        devices = where.devices
        skeleton = context.skeleton()
        blocks: list[Block] = []
        flip = runtime.flipped_byte()
        for i, device in zip(span, devices, strict=True):
            if reuse is not None and i in reuse.span and reuse.device_of(i) == device:
                blocks.append(reuse.block(i))
                continue
            weights = context.to_runtime(context.store.load_layer(i, keep), device)
            # a test's fault, never a real node's; a reload's runtime has none (it cures it)
            if flip is not None and flip[0] == i:
                weights = flip_byte(weights, flip[1], i)
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
            devices=devices,
        )
        kv = KVCacheManager(shape, runtime.kv_cache_bytes, runtime.session_idle_timeout_s)
        if reuse is not None and runtime.prompt_cache:  # the blocks of the layers it keeps
            kv.restore_prefixes(carried(reuse.kv.prefixes, span))
        shard = cls(context, span, blocks, kv, where)
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
        for run in self._runs(layers):
            hidden = hidden.to(run.device)
            position_ids = torch.arange(position, position + seq, device=run.device)
            blocks, kinds = self._of_run(run)
            step = StepInputs(
                run.rotary, kinds, hidden, position_ids.unsqueeze(0), position, self._explicit_masks
            )
            for block, kind in zip(blocks, kinds, strict=True):
                cos_sin, mask = step.for_layer(kind)
                hidden = block(hidden, cos_sin, mask, cache)
        cache.commit()
        return hidden

    def adopt_prefix(self, session: SessionId, digests: Sequence[str], layers: LayerSpan) -> None:
        """Start `session` (afresh) on `layers` from the kept prompt blocks `digests`
        (`swarm.runtime.prefix_blocks`); PrefixMissingError where one is no longer kept."""
        self.kv.adopt(session, digests, self._check_layers(layers))

    def verify(
        self,
        session: SessionId,
        hidden: torch.Tensor,
        position: int,
        layers: LayerSpan | None = None,
    ) -> torch.Tensor:
        """Like `forward`, but every position computed as a one-position decode step of its
        own would be: a verify step's rows, whose logits must be the bits decoding would see
        (a prefill's products and attention round differently). `decode_rows` of this step
        alone."""
        (out,) = self.decode_rows([(session, hidden, position)], layers or self.span).outputs
        if isinstance(out, SwarmError):
            raise out
        return out

    def _runs(self, layers: LayerSpan) -> list[_Run]:
        """`layers` (checked to lie in the span) as runs of consecutive layers on one device."""
        first = layers.start - self.span.start
        end = first + len(layers)
        held = min(max(self.placement.held, first), end)  # where the device group ends
        groups = ((0, first, held), (1, held, end))
        return [
            _Run(self.placement.devices[a], self._rotaries[group], a, b)
            for group, a, b in groups
            if a < b
        ]

    def device_of(self, layer: int) -> torch.device:
        return self.placement.devices[layer - self.span.start]

    def synchronize(self) -> None:
        """Return once the work queued on every device of the shard is done: what a timing
        read after this says is what the step took, a GPU's part included."""
        for acc in self._accelerators:
            acc.synchronize()

    def _of_run(self, run: _Run) -> tuple[list[Block], list[AttentionKind]]:
        """The blocks of `run` and their attention kinds."""
        return self._blocks[run.first : run.end], self._kinds[run.first : run.end]

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

    def decode_batch(
        self, steps: Sequence[DecodeStep], layers: LayerSpan
    ) -> list[torch.Tensor | SwarmError]:
        """`decode_rows`' outputs: each step's hidden states, or the error it alone hit."""
        return self.decode_rows(steps, layers).outputs

    @torch.inference_mode()
    def decode_rows(self, steps: Sequence[DecodeStep], layers: LayerSpan) -> DecodeRun:
        """Decode positions of several sessions (distinct), all running `layers`: a decode
        step's one, a verify step's several consecutive ones, every row computed as a
        one-position decode step of its own would be. Where every layer computes each row
        alone (swarm's kernels) and sees every key (no window hides one, no explicit masks),
        all rows go through each layer in one call, each row attending over its own
        session's cache up to its own position: the bits of one-position steps, whatever
        rows share the call. Elsewhere one-position steps run as one batched call where the
        layers have one (to float rounding off swarm's kernels), and the rows of a verify
        step each as its own step, as a verify step alone always ran."""
        layers = self._check_layers(layers)
        outputs: list[torch.Tensor | SwarmError] = []
        ready: list[_Began] = []
        for i, (session, hidden, position) in enumerate(steps):
            try:
                hidden = self._check_hidden(hidden)
                cache = self._begin(session, position, hidden.shape[1], layers)
            except SwarmError as e:
                outputs.append(e)
                continue
            ready.append(_Began(i, cache, hidden, position))
            outputs.append(hidden)  # replaced below
        if not ready:
            return DecodeRun(outputs, shared=False)
        blocks, kinds = self._layers(layers)
        # a batched block sees every key: exact unless a window hides some of them
        end = max(step.position + step.rows for step in ready)
        unmasked = not self._explicit_masks and all(
            k.window is None or end <= k.window for k in kinds
        )
        batched = unmasked and self._batched_blocks is not None
        if batched and all(_rows_alone(b, step.cache) for b in blocks for step in ready):
            together, apart = ready, []
        else:
            single = [step for step in ready if step.rows == 1]
            together = single if batched and len(single) > 1 else []
            apart = [step for step in ready if step not in together]
        if together:
            outs = self._together(layers, together)
            for step, out in zip(together, outs, strict=True):
                outputs[step.index] = out
        for step in apart:
            outputs[step.index] = self._apart(layers, step)
        # one call per layer for every row: what the call took is the cost of that many rows
        shared = not apart or (len(ready) == 1 and ready[0].rows == 1)
        return DecodeRun(outputs, shared)

    def _together(self, layers: LayerSpan, steps: list[_Began]) -> list[torch.Tensor]:
        """Every row of `steps` through the `decode_batch` of each block of `layers` in one
        call (only where every block has one)."""
        assert self._batched_blocks is not None
        # hidden: [rows, 1, hidden_size]; position_ids: [rows, 1], each row its own position
        rows = [step.hidden.view(step.rows, 1, -1) for step in steps]
        hidden = rows[0] if len(rows) == 1 else torch.cat(rows)  # a lone step's rows as they are
        positions = [step.position + i for step in steps for i in range(step.rows)]
        caches = [step.cache for step in steps]
        for run in self._runs(layers):
            hidden = hidden.to(run.device)
            blocks = self._batched_blocks[run.first : run.end]
            kinds = self._kinds[run.first : run.end]
            inputs = StepInputs.for_rows(run.rotary, kinds, hidden, positions)
            for block, kind in zip(blocks, kinds, strict=True):
                cos_sin, _ = inputs.for_layer(kind)
                hidden = block.decode_batch(hidden, cos_sin, caches)
        outs = []
        first = 0
        for step in steps:
            step.cache.commit()
            outs.append(hidden[first : first + step.rows].reshape(1, step.rows, -1))
            first += step.rows
        return outs

    def _apart(self, layers: LayerSpan, step: _Began) -> torch.Tensor:
        """`step`'s rows one after the other, each a one-position step on its own cache."""
        rows = []
        for i in range(step.rows):
            position = step.position + i
            step.cache.begin_step(position, 1)
            row = step.hidden[:, i : i + 1]
            for run in self._runs(layers):
                row = row.to(run.device)
                position_ids = torch.tensor([[position]], device=run.device)
                blocks, kinds = self._of_run(run)
                inputs = StepInputs(
                    run.rotary, kinds, row, position_ids, position, self._explicit_masks
                )
                for block, kind in zip(blocks, kinds, strict=True):
                    cos_sin, mask = inputs.for_layer(kind)
                    row = block(row, cos_sin, mask, step.cache)
            step.cache.commit()
            rows.append(row)
        return rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)

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
        ready: list[tuple[int, SessionKV, int]] = []  # index, cache, first position
        hiddens: list[torch.Tensor] = []
        for i, (session, hidden, position) in enumerate(steps):
            try:
                hidden = self._check_hidden(hidden)
                cache = self._begin(session, position, hidden.shape[1], layers)
            except SwarmError as e:
                results.append(e)
                continue
            ready.append((i, cache, position))
            hiddens.append(hidden)
            results.append(hidden)  # replaced below
        caches = [cache for _, cache, _ in ready]
        for run in self._runs(layers):
            hiddens = [h.to(run.device) for h in hiddens]
            blocks, kinds = self._of_run(run)
            inputs = [
                StepInputs(
                    run.rotary,
                    kinds,
                    h,
                    torch.arange(at, at + h.shape[1], device=run.device).unsqueeze(0),
                    at,
                    self._explicit_masks,
                )
                for h, (_, _, at) in zip(hiddens, ready, strict=True)
            ]
            for block, kind in zip(blocks, kinds, strict=True):
                per_session = [step.for_layer(kind) for step in inputs]
                batched = getattr(block, "prefill_batch", None)
                if batched is not None and len(ready) > 1:
                    hiddens = batched(hiddens, per_session, caches)
                else:
                    hiddens = [
                        block(h, cos_sin, mask, cache)
                        for h, (cos_sin, mask), cache in zip(
                            hiddens, per_session, caches, strict=True
                        )
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
        return hidden.to(dtype=self.context.dtype)  # each run moves it to its device


def _rows_alone(block: Block, cache: SessionKV) -> bool:
    """Whether `block` computes each decode row alone on `cache`, the same bits in any call
    (swarm's kernels): then any rows may share its call, a verify step's among others'."""
    alone = getattr(block, "decodes_rows_alone", None)
    return alone is not None and bool(alone(cache))


def _settle_loaded_objects() -> None:
    """Take what a load built out of the cyclic collector's view. A model's layers are tens of
    thousands of long-lived Python objects (a 48-layer, 64-expert model ~100k), and every full
    collection, which a decode step's short-lived objects set off every few steps, walked them
    all: 15% of such a model's decode step (59 to 51 ms a step). Unfrozen and collected first,
    so that what a move dropped since the last load is still freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
