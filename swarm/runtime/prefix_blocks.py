"""A shard's kept prompt chunks: the keys and values a prefill chunk left in a session's
cache, kept after the session ends, for the next session whose prompt starts with the same
tokens.

A block is one prefill chunk (`prefill_chunks`: chunks end at fixed positions, so chunk k of
every prompt that starts alike is the same call with the same bits). It is named by its
digest, which the entry computes from every token up to the block's end
(`swarm.inference.prompt_keys`): a hop never sees tokens, only hidden states, and a digest
of the whole prefix makes a block usable only after the very blocks it followed. It is kept
per layer span, since a session may run part of a shard's layers. The blocks share the
shard's cache budget with its sessions, and sessions always win: a session that needs room
evicts blocks, least recently used first, before any other session."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from swarm.types import LayerSpan

BlockKey = tuple[str, LayerSpan]  # (digest, the layers it holds)


@dataclass(frozen=True)
class PrefixBlock:
    """One chunk's keys and values for each layer of a span: [1, kv_heads, tokens, head_dim]."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def tokens(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys, *self.values))


def carried(blocks: PrefixBlocks, span: LayerSpan) -> list[tuple[BlockKey, PrefixBlock]]:
    """What a shard moving to `span` keeps of `blocks`, its old shard's: each block kept for
    layers that cover `span`, cut to `span`'s layers (the most recently used first). A
    block of fewer layers lacks some of the new span's and is left behind."""
    moved = []
    for (digest, layers), block in blocks.recent_first():
        if layers.start <= span.start and span.end <= layers.end:
            first, end = span.start - layers.start, span.end - layers.start
            cut = PrefixBlock(block.keys[first:end], block.values[first:end])
            moved.append(((digest, span), cut))
    return moved


@dataclass
class PrefixCounts:
    """What the blocks did since the shard loaded: read by /status and /metrics."""

    adopted: int = 0  # blocks a new session started from
    missing: int = 0  # sessions that asked for blocks this shard no longer held
    kept: int = 0  # blocks kept from a session's prefill
    evicted: int = 0  # blocks dropped for room


class PrefixBlocks:
    """The kept blocks of one shard, least recently used first. A block is dropped only
    once no kept block follows it: a prompt's blocks go from its last one back, so what is
    left of it is still a prefix someone can start from."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[BlockKey, PrefixBlock] = OrderedDict()
        self._parent: dict[BlockKey, BlockKey] = {}  # a block -> the one it follows
        self._children: dict[BlockKey, int] = {}  # a block -> kept blocks that follow it
        self.used_bytes = 0
        self.counts = PrefixCounts()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def held(self, digests: Sequence[str], layers: LayerSpan) -> int:
        """How many of `digests`, from the first, are held for `layers`."""
        for i, digest in enumerate(digests):
            if (digest, layers) not in self._blocks:
                return i
        return len(digests)

    def take(self, digests: Sequence[str], layers: LayerSpan) -> list[PrefixBlock] | None:
        """Every block of `digests` for `layers`, each now the most recently used; None
        (and nothing touched) where one is missing."""
        keys = [(d, layers) for d in digests]
        if any(k not in self._blocks for k in keys):
            return None
        for key in keys:
            self._blocks.move_to_end(key)
        return [self._blocks[k] for k in keys]

    def put(self, key: BlockKey, block: PrefixBlock, after: BlockKey | None = None) -> None:
        """Keep `block` as `key`; `after`: the kept block it follows (None: the first of
        its prompt, or not known)."""
        old = self._blocks.pop(key, None)
        if old is not None:
            self.used_bytes -= old.nbytes
        self._blocks[key] = block
        self.used_bytes += block.nbytes
        self.counts.kept += 1
        if after is not None and after in self._blocks and key not in self._parent:
            self._parent[key] = after
            self._children[after] = self._children.get(after, 0) + 1

    def nbytes(self, key: BlockKey) -> int:
        block = self._blocks.get(key)
        return 0 if block is None else block.nbytes

    def evict_oldest(self, spare: Collection[BlockKey] = ()) -> int:
        """Drop the least recently used block not in `spare`: the bytes freed (0: none
        was left to drop)."""
        key = next((k for k in self._blocks if k not in spare and not self._children.get(k)), None)
        if key is None:
            return 0
        block = self._blocks.pop(key)
        self._children.pop(key, None)
        parent = self._parent.pop(key, None)
        if parent is not None:
            self._children[parent] -= 1
        self.used_bytes -= block.nbytes
        self.counts.evicted += 1
        return block.nbytes

    def recent_first(self) -> list[tuple[BlockKey, PrefixBlock]]:
        """Every block, the most recently used first."""
        return list(reversed(self._blocks.items()))
