"""How a session is replayed on a new route after a hop failed: every cache of the route is
rebuilt, position by position, with the bits a route that never failed would hold, and the
step's last position with the bits its entry would have sampled from.

A session's positions were made two ways: the prompt by its first step, a prefill cut into
chunks (`prefill_chunks`, cut at fixed positions), and every token after it by a decode
step (or a verify step's row, the same bits). A prefill's products and attention round
differently from a decode row's (on the embedded model's packed layers a decode row and the
same position prefilled differ by up to ~8 in a hidden state of the last layer), so a replay
that ran the whole history as one prefill left caches that no hop of the first route held,
and the text went its own way a few tokens after the fault. A replay therefore runs the
prompt as the first step did, then the tokens after it as verify steps, whose rows every hop
computes as one-position decode steps would, at most `rows_per_step` rows a step, each sent
once the one before it has come back (as a verify step always is: it may travel on a fast
link, and nothing of the session may be in flight on the other one)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from swarm.types import SessionId

# (session, hidden [1, rows, hidden], first position, decode rows?) -> the step's output
Forward = Callable[[SessionId, torch.Tensor, int, bool], Awaitable[torch.Tensor]]


@dataclass(frozen=True)
class ReplayStep:
    start: int  # the first position it runs
    end: int  # one past its last
    decode: bool  # each row as a one-position decode step (a verify step); else a prefill


def replay_steps(tokens: int, prefilled: int, rows_per_step: int) -> list[ReplayStep]:
    """The steps that replay `tokens` positions of a session whose first step prefilled
    `prefilled` of them: that prefill whole (the pipeline cuts it into the chunks the first
    step had), then the rest as decode rows, at most `rows_per_step` a step."""
    if rows_per_step < 1:
        raise ValueError(f"rows_per_step must be positive, not {rows_per_step}")
    prompt = max(0, min(tokens, prefilled))
    steps = [ReplayStep(0, prompt, decode=False)] if prompt else []
    steps += [
        ReplayStep(start, min(tokens, start + rows_per_step), decode=True)
        for start in range(prompt, tokens, rows_per_step)
    ]
    return steps


async def replay(
    forward: Forward,
    session: SessionId,
    hidden: torch.Tensor,
    prefilled: int,
    rows_per_step: int,
) -> torch.Tensor:
    """Run `replay_steps` over `hidden` [1, tokens, hidden] (the embeddings of every token
    so far) through `forward`, one step after the other; the last position's output
    [1, 1, hidden]."""
    out = hidden
    for step in replay_steps(hidden.shape[1], prefilled, rows_per_step):
        rows = hidden[:, step.start : step.end]
        out = await forward(session, rows, step.start, step.decode)
    return out[:, -1:]
