"""How a prefill is cut: chunks that end at multiples of `size` counted from position 0 of
the session, the last one shorter where the prompt ends between two.

The bits of a prefilled position depend on the shape of the call that computed it (on the
packed layers, attention rounds by the call's rows and keys), so a cut that moved with the
prompt's length would give the same position of two prompts that start alike different
bits. Cut at fixed positions, chunk k of every prompt that starts with the same tokens is the
same call with the same result: what lets a hop keep a prompt's chunks and hand them to the
next prompt that starts the same way (`swarm.runtime.prefix_blocks`), and lets one process, a
swarm and a replay after a failover hold the same numbers."""

from __future__ import annotations

import itertools


def prefill_chunks(tokens: int, size: int, start: int = 0) -> list[tuple[int, int]]:
    """[start, end) offsets, relative to `start`, covering the `tokens` positions that begin
    at session position `start`; each chunk ends at a multiple of `size` (counted from
    position 0) or at the last position."""
    if size < 1:
        raise ValueError(f"a chunk needs a positive size, not {size}")
    bounds = [0]
    while bounds[-1] < tokens:
        at = start + bounds[-1]
        bounds.append(min(tokens, (at // size + 1) * size - start))
    if len(bounds) == 1:  # no tokens: one empty chunk, as a step of nothing always was
        bounds.append(0)
    return list(itertools.pairwise(bounds))
