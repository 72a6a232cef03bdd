"""Per-session attention caches for the layers of one shard, under one byte budget.

A session's keys and values live in tensors preallocated per layer (grown by doubling, never by
concatenating per step). Layers write the step's new positions through `update`, which has the
signature Hugging Face attention modules call; the step becomes part of the session only when
the whole span has run (`commit`), so a step that fails half-way leaves the cache consistent."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarm.errors import (
    KVCacheFullError,
    PositionMismatchError,
    PrefixMissingError,
    SessionNotFoundError,
)
from swarm.runtime.prefix_blocks import BlockKey, PrefixBlock, PrefixBlocks
from swarm.types import LayerSpan, SessionId

_GROWTH_QUANTUM = 64  # tokens; capacities are multiples of this


@dataclass(frozen=True)
class KVShape:
    layers: tuple[int, ...]  # global indices of the layers this cache covers
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    # each layer's device where they differ (a node that is part GPU); () = all on `device`
    devices: tuple[torch.device, ...] = ()

    def device_at(self, slot: int) -> torch.device:
        return self.devices[slot] if self.devices else self.device

    def bytes_per_token(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * element


class SessionKV:
    """One session's keys and values for every layer of the shard."""

    def __init__(self, session: SessionId, shape: KVShape) -> None:
        self.session = session
        self.shape = shape
        self.length = 0  # committed positions
        self.capacity = 0
        self.last_used = 0.0
        self.layers: LayerSpan | None = None  # the layers this session runs on the shard
        self._slot = {layer: i for i, layer in enumerate(shape.layers)}
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._step_tokens = 0
        # the digests of the kept blocks its positions are, from position 0 on: those it
        # started from, then those kept of its own prefill (a block without the ones before
        # it is of no use to anyone)
        self.chain: list[str] = []

    @property
    def nbytes(self) -> int:
        return self.capacity * self.shape.bytes_per_token()

    def resize(self, capacity: int) -> None:
        s = self.shape
        keep = self.length
        new_keys, new_values = [], []
        for i in range(len(s.layers)):
            # keys, values: [batch=1, kv_heads, capacity, head_dim]
            device = s.device_at(i)
            k = torch.empty((1, s.kv_heads, capacity, s.head_dim), dtype=s.dtype, device=device)
            v = torch.empty_like(k)
            if keep:
                k[:, :, :keep] = self._keys[i][:, :, :keep]
                v[:, :, :keep] = self._values[i][:, :, :keep]
            new_keys.append(k)
            new_values.append(v)
        self._keys, self._values, self.capacity = new_keys, new_values, capacity

    def begin_step(self, position: int, tokens: int) -> None:
        """Start a step that writes `tokens` positions from `position` (<= length: a replay
        rewinds the cache to that point)."""
        if position > self.length:
            raise PositionMismatchError(
                f"session {self.session}: step at position {position}, "
                f"but the cache holds {self.length}"
            )
        if position + tokens > self.capacity:
            raise KVCacheFullError(f"session {self.session}: capacity not reserved for the step")
        self.length = position
        self._step_tokens = tokens
        if position == 0:  # computed afresh (a retry, a replay): its blocks are its own again
            self.chain = []

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys/values for one layer; return all positions so far."""
        slot = self._slot[layer_idx]
        end = self.length + self._step_tokens
        self._keys[slot][:, :, self.length : end] = key
        self._values[slot][:, :, self.length : end] = value
        return self._keys[slot][:, :, :end], self._values[slot][:, :, :end]

    def row_slots(self, layer_idx: int) -> list[tuple[int, int, int, int]]:
        """Where swarm's decode-attention kernel (`swarm.runtime.weights.native.
        decode_attention`) writes this layer's keys and values for the step's positions, each
        run as a decode position of its own: per position, from the step's first, the
        addresses of the layer's keys and values [kv_heads, capacity, head_dim], the position
        and the capacity. The kernel writes each row's key before it reads the cache up to
        that row, so a verify step's row i sees rows 0..i and nothing later, as i + 1
        one-position steps would."""
        slot = self._slot[layer_idx]
        keys, values = self._keys[slot].data_ptr(), self._values[slot].data_ptr()
        return [(keys, values, self.length + i, self.capacity) for i in range(self._step_tokens)]

    def commit(self) -> None:
        self.length += self._step_tokens
        self._step_tokens = 0

    def block(self, start: int, tokens: int, layers: LayerSpan) -> PrefixBlock:
        """A copy of positions [start, start + tokens) of `layers`, to keep past the session."""
        if start + tokens > self.length:
            raise PositionMismatchError(
                f"session {self.session}: positions {start}:{start + tokens} asked, "
                f"the cache holds {self.length}"
            )
        slots = [self._slot[layer] for layer in layers]
        end = start + tokens
        return PrefixBlock(
            tuple(self._keys[i][:, :, start:end].clone() for i in slots),
            tuple(self._values[i][:, :, start:end].clone() for i in slots),
        )

    def fill(self, blocks: Sequence[PrefixBlock], layers: LayerSpan) -> None:
        """Start the session from `blocks`, one after the other from position 0, for
        `layers` (capacity reserved for them)."""
        at = 0
        for block in blocks:
            end = at + block.tokens
            for layer, key, value in zip(layers, block.keys, block.values, strict=True):
                self._keys[self._slot[layer]][:, :, at:end] = key
                self._values[self._slot[layer]][:, :, at:end] = value
            at = end
        self.layers = layers
        self.length = at


class KVCacheManager:
    """All sessions of one shard: budget, least-recently-used eviction, idle expiry."""

    def __init__(
        self,
        shape: KVShape,
        budget_bytes: int,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shape = shape
        self.budget_bytes = budget_bytes
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._sessions: OrderedDict[SessionId, SessionKV] = OrderedDict()  # oldest use first
        self.prefixes = PrefixBlocks()  # kept prompt chunks, under the same budget

    @property
    def used_bytes(self) -> int:
        return self.session_bytes + self.prefixes.used_bytes

    @property
    def session_bytes(self) -> int:
        return sum(kv.nbytes for kv in self._sessions.values())

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    def sessions(self) -> Sequence[SessionId]:
        return list(self._sessions)

    def snapshot(self) -> tuple[int, int]:
        """(sessions, bytes in use), safe to read from another thread than the compute
        thread: one copy of the table, taken while the GIL is held."""
        held = list(self._sessions.values())
        return len(held), sum(kv.nbytes for kv in held)

    def get(self, session: SessionId) -> SessionKV:
        kv = self._sessions.get(session)
        if kv is None:
            raise SessionNotFoundError(f"session {session} has no cache on this shard")
        return kv

    def acquire(self, session: SessionId, position: int, tokens: int) -> SessionKV:
        """The session's cache, created if new, with room for [position, position + tokens)."""
        kv = self._sessions.get(session)
        if kv is None:
            if position != 0:
                raise SessionNotFoundError(
                    f"session {session} has no cache on this shard, "
                    f"and the step starts at {position}"
                )
            kv = SessionKV(session, self.shape)
            self._sessions[session] = kv
        kv.last_used = self._clock()
        self._sessions.move_to_end(session)
        needed = position + tokens
        if needed > kv.capacity:
            try:
                self._grow(kv, needed)
            except KVCacheFullError:
                if kv.length == 0:
                    self.close(session)
                raise
        return kv

    def _grow(self, kv: SessionKV, needed: int) -> None:
        per_token = self.shape.bytes_per_token()
        exact = _round_up(needed, _GROWTH_QUANTUM)
        preferred = max(exact, _round_up(2 * kv.capacity, _GROWTH_QUANTUM))
        for capacity in (preferred, exact):
            if capacity * per_token <= self.budget_bytes:  # else evicting others cannot help
                self._make_room((capacity - kv.capacity) * per_token, keep=kv.session)
                kv.resize(capacity)
                return
        raise KVCacheFullError(
            f"KV cache budget of {self.budget_bytes} bytes cannot hold {needed} positions for "
            f"session {kv.session} ({exact * per_token} bytes) beside the sessions in use"
        )

    def _make_room(self, extra: int, keep: SessionId) -> None:
        """Evict kept prompt blocks, then least-recently-used sessions other than `keep`,
        until `extra` bytes fit: a session always wins over a kept block."""
        while self.used_bytes + extra > self.budget_bytes and self.prefixes.evict_oldest():
            pass
        used = self.used_bytes
        for victim in [s for s in self._sessions if s != keep]:
            if used + extra <= self.budget_bytes:
                return
            used -= self._sessions[victim].nbytes
            self.close(victim)

    def close(self, session: SessionId) -> bool:
        return self._sessions.pop(session, None) is not None

    def adopt(self, session: SessionId, digests: Sequence[str], layers: LayerSpan) -> SessionKV:
        """Start `session` (afresh, whatever it held) from the kept blocks `digests` of
        `layers`, its cache then holding their positions; PrefixMissingError where one of
        them is no longer kept."""
        blocks = self.prefixes.take(digests, layers)
        if blocks is None:
            self.prefixes.counts.missing += 1
            held = self.prefixes.held(digests, layers)
            raise PrefixMissingError(
                f"session {session}: {len(digests)} kept prompt blocks asked of layers "
                f"{layers}, {held} of them held here",
                held,
            )
        self.close(session)
        kv = self.acquire(session, 0, sum(b.tokens for b in blocks))
        kv.fill(blocks, layers)
        kv.chain = list(digests)
        self.prefixes.counts.adopted += len(blocks)
        return kv

    def restore_prefixes(self, blocks: Sequence[tuple[BlockKey, PrefixBlock]]) -> int:
        """Keep `blocks` (the most recently used first), as many as the budget has room for
        beside the sessions; how many were kept."""
        room = self.budget_bytes - self.used_bytes
        fitting: list[tuple[BlockKey, PrefixBlock]] = []
        for key, block in blocks:
            if block.nbytes > room:
                break
            fitting.append((key, block))
            room -= block.nbytes
        for key, block in reversed(fitting):  # the least recently used first, as kept
            self.prefixes.put(key, block)
        self.prefixes.counts.kept -= len(fitting)  # read back, not kept from a session
        return len(fitting)

    def keep(self, session: SessionId, digest: str, start: int, tokens: int) -> None:
        """Keep positions [start, start + tokens) of `session`'s layers past the session,
        as the block `digest`: only right after the blocks before it, while they are still
        kept, and where the budget has room beside the sessions (blocks of other prompts
        make way, least recently used first; a session never does, nor the blocks this one
        follows)."""
        kv = self.get(session)
        if kv.layers is None or start != tokens * len(kv.chain):
            return  # not the block after the session's last: one before it was not kept
        chain = {(d, kv.layers) for d in kv.chain}
        if any(key not in self.prefixes for key in chain):
            return  # one it follows was dropped since: this one would be of no use
        key = (digest, kv.layers)
        if key in self.prefixes:
            self.prefixes.take([digest], kv.layers)  # now the most recently used
            kv.chain.append(digest)
            return
        room = self.budget_bytes - self.session_bytes
        per_token = self.shape.bytes_per_token() // len(self.shape.layers) * len(kv.layers)
        if tokens * per_token + sum(self.prefixes.nbytes(k) for k in chain) > room:
            return  # no room however many other blocks made way
        block = kv.block(start, tokens, kv.layers)
        while self.prefixes.used_bytes + block.nbytes > room:
            if not self.prefixes.evict_oldest(spare=chain):
                return
        self.prefixes.put(key, block, (kv.chain[-1], kv.layers) if kv.chain else None)
        kv.chain.append(digest)

    def evict_idle(self) -> list[SessionId]:
        deadline = self._clock() - self.idle_timeout_s
        idle = [s for s, kv in self._sessions.items() if kv.last_used < deadline]
        for session in idle:
            self.close(session)
        return idle


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum
