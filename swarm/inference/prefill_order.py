"""Which prefill chunks a hop runs together next: a pure rule over what waits.

Chunks of several sessions run as one call (`Shard.prefill_batch`), each session's rows its
own; a session's chunks run one per call, in the order they arrived, since each one extends
the cache the one before it wrote. Among the sessions that wait, the one least far along goes
first: the chunk with the lowest position, then the one that arrived first. So a new request's
prefill (position 0) never waits behind the later chunks of replays, and replays that a fault
started together advance together, chunk by chunk, and resume together instead of one after
another. The batch takes sessions in that order while their tokens fit `max_tokens` (the first
always fits) and at most `max_sessions` of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WaitingChunk:
    session: str
    position: int  # the session position of the chunk's first token
    tokens: int  # the chunk's length
    arrived: int  # arrival order at this hop, lower first


def next_batch(waiting: Sequence[WaitingChunk], max_sessions: int, max_tokens: int) -> list[int]:
    """The indices into `waiting` of the chunks to run now, in the order the rule gives."""
    first: dict[str, int] = {}  # each session's earliest-arrived chunk
    for i, chunk in enumerate(waiting):
        held = first.get(chunk.session)
        if held is None or chunk.arrived < waiting[held].arrived:
            first[chunk.session] = i
    order = sorted(first.values(), key=lambda i: (waiting[i].position, waiting[i].arrived))
    chosen: list[int] = []
    tokens = 0
    for i in order:
        if len(chosen) == max_sessions:
            break
        if chosen and tokens + waiting[i].tokens > max_tokens:
            continue  # a shorter chunk further down may still fit
        chosen.append(i)
        tokens += waiting[i].tokens
    return chosen
