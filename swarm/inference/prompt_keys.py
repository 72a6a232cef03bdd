"""The entry's half of the prompt cache: what names a prompt's blocks, and which of them the
hops of a route keep.

A block is one whole prefill chunk (`prefill_chunks` cuts at fixed positions). Its digest
covers every token up to its end, so equal digests mean equal prefixes, and a hop that keeps
a block under its digest (`swarm.runtime.prefix_blocks`) holds the very bits a new prompt
with that prefix would compute there. The entry learns what each hop keeps from what it
sent: every whole chunk it sends is kept by each hop of the route where the hop has room. A
hop that dropped a block since (for room, or it restarted) answers PREFIX_MISSING, and the
entry forgets what it believed the hop keeps and sends the prompt whole."""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.types import LayerSpan, NodeId

_DIGEST_BYTES = 16
_KEPT_PER_HOP = 1 << 16  # digests remembered per hop, oldest forgotten first
# a route that keeps more of a prompt is taken over the fastest one while its decode step is
# at most this many times the fastest's: a conversation's turns stay where its blocks are
# unless that route got much slower than another
STICKY_SLOWER = 1.5


def block_digests(token_ids: Sequence[int], block_tokens: int, salt: str) -> list[str]:
    """The digest of each whole block of `token_ids`, from the first: BLAKE2b of the digest
    before it and the block's tokens. `salt` names what else shapes the blocks' bits (the
    block size, how activations travel), so blocks made otherwise never match."""
    digests: list[str] = []
    last = hashlib.blake2b(salt.encode(), digest_size=_DIGEST_BYTES).digest()
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(last, digest_size=_DIGEST_BYTES)
        h.update(b"".join(t.to_bytes(4, "little") for t in token_ids[start : start + block_tokens]))
        last = h.digest()
        digests.append(last.hex())
    return digests


def reusable_blocks(held: int, prompt_tokens: int, block_tokens: int) -> int:
    """How many of the `held` blocks a prompt of `prompt_tokens` starts from: never its
    last token, whose step gives the logits of the first new one."""
    return max(0, min(held, (prompt_tokens - 1) // block_tokens))


def keeps_the_turn(
    best_decode_ms: float, best_blocks: int, kept_decode_ms: float, kept_blocks: int
) -> bool:
    """Whether a prompt goes the route that keeps `kept_blocks` of its blocks rather than
    the fastest route, which keeps `best_blocks`: it keeps more, and is not much slower."""
    return kept_blocks > best_blocks and kept_decode_ms <= STICKY_SLOWER * best_decode_ms


@dataclass(frozen=True)
class HopKey:
    """One hop's kept blocks: a node and the layers it runs for the route (blocks are kept
    per span; a node that moves to other layers keeps none of the old ones)."""

    node_id: NodeId
    span: LayerSpan


class KeptBlocks:
    """What this entry believes each hop keeps: the digests it sent through the hop as whole
    chunks, the most recent last."""

    def __init__(self, kept_per_hop: int = _KEPT_PER_HOP) -> None:
        self._hops: dict[HopKey, OrderedDict[str, None]] = {}
        self._limit = kept_per_hop

    def held(self, hops: Iterable[HopKey], digests: Sequence[str]) -> int:
        """How many of `digests`, from the first, every one of `hops` keeps. A node that
        kept blocks for a span keeps them for the part of it it serves after a move that
        shrank its span (`prefix_blocks.carried`)."""
        held = len(digests)
        for hop in hops:
            kept = [
                k
                for key, k in self._hops.items()
                if key.node_id == hop.node_id
                and key.span.start <= hop.span.start
                and hop.span.end <= key.span.end
            ]
            if not kept:
                return 0
            held = next(
                (i for i, d in enumerate(digests[:held]) if not any(d in k for k in kept)), held
            )
        return held

    def sent(self, hops: Iterable[HopKey], digests: Iterable[str]) -> None:
        """`digests` went through `hops` as whole chunks (or were started from)."""
        digests = list(digests)
        for hop in hops:
            kept = self._hops.setdefault(hop, OrderedDict())
            for digest in digests:
                kept[digest] = None
                kept.move_to_end(digest)
            while len(kept) > self._limit:
                kept.popitem(last=False)

    def holders(self, digest: str) -> set[NodeId]:
        """The nodes this entry sent the block `digest` through."""
        return {hop.node_id for hop, kept in self._hops.items() if digest in kept}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "hops": [
                {"node": hop.node_id, "span": [hop.span.start, hop.span.end], "digests": list(d)}
                for hop, d in self._hops.items()
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> KeptBlocks:
        """What `to_json` wrote; ValueError where it does not read as that."""
        kept = cls()
        try:
            if data["format"] != 1:
                raise ValueError(f"format {data['format']!r}, not 1")
            for hop in data["hops"]:
                key = HopKey(NodeId(str(hop["node"])), LayerSpan(*map(int, hop["span"])))
                kept.sent([key], [str(d) for d in hop["digests"]])
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a record of kept blocks ({e!r})") from None
        return kept

    def save(self, path: Path) -> None:
        """Write it whole or not at all (OSError: nothing written)."""
        temporary = path.with_name(path.name + ".partial")
        try:
            temporary.write_text(json.dumps(self.to_json()))
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise

    @classmethod
    def read(cls, path: Path) -> KeptBlocks:
        """What `save` wrote; empty where nothing was, ValueError or OSError where it does
        not read."""
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON ({e})") from None
        return cls.from_json(data)

    def forget(self, node_id: NodeId) -> None:
        """Everything a node keeps: it said it dropped some (or left)."""
        for hop in [h for h in self._hops if h.node_id == node_id]:
            del self._hops[hop]
