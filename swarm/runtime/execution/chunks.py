"""How a long prefill is cut: consecutive chunks of at most `size` tokens, equal within one
token. One process and a swarm cut the same way, so their caches hold the same numbers."""

from __future__ import annotations

import itertools


def prefill_chunks(tokens: int, size: int) -> list[tuple[int, int]]:
    """[start, end) offsets covering `tokens` positions, each chunk at most `size` long."""
    count = max(1, -(-tokens // size))
    bounds = [tokens * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))
