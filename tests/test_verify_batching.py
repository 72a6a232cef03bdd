"""Verify steps batch with decode steps: at a hop, through the event loop's `DecodeBatcher`
and through the compute thread's `ThreadSteps` (fast-link frames), a verify step that arrives
with other sessions' decode steps runs in their call, and every step gets what it gets alone;
at the entry, a verify step's rows join the head's batch and pick the tokens they pick alone.
Only the hop's outbound links are stand-ins (the transport seam)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from itertools import count
from typing import Any

import pytest
import torch

from harness.polling import until
from swarm.config import NetConfig, RuntimeConfig
from swarm.inference.ahead import StepsAhead
from swarm.inference.batching import DecodeBatcher
from swarm.inference.head import EntryHead, HeadJob
from swarm.inference.hop import HopServer
from swarm.inference.hop_core import HopCore
from swarm.inference.hop_ledger import HopLedger
from swarm.inference.leaving import LeavingGate
from swarm.inference.thread_steps import OwnEntry, ThreadSteps
from swarm.inference.waiters import StepWaiters
from swarm.net.endpoint import Inbox
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import native
from swarm.sampling_settings import SamplingSettings
from swarm.telemetry import SpeedMeter, StepCost
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import FrameCodec, Hop, Peer, Received, ResultMessage, StepMessage, SwarmKeys

pytestmark = pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built")

ME = NodeId("hop")
ENTRY = Peer(NodeId("entry"), "127.0.0.1:2")
# session: (prompt, the step's tokens); more than one token is a verify step
STEPS = {
    "a": ([5, 6, 7], [40]),
    "b": ([8, 9, 10, 11, 12], [41, 42, 43, 44]),
    "c": ([13], [45]),
}
ROWS = sum(len(tokens) for _, tokens in STEPS.values())


class _Sent:
    """The hop's outbound links: what it sends, kept."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def send(self, address: str, message: Any) -> None:
        self.messages.append(message)

    def send_now(self, address: str, message: Any, *, wait: bool = False) -> bool:
        return False  # no fast link is open: every frame goes through `send`


@dataclasses.dataclass
class _Paces(SpeedMeter):
    """The speed meter, with the decode samples it was given."""

    decodes: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def record_decode(self, layers: int, rows: int, elapsed_ms: float) -> None:
        self.decodes.append((layers, rows))
        super().record_decode(layers, rows, elapsed_ms)


@dataclasses.dataclass
class _Hop:
    hop: HopServer
    sent: _Sent
    speed: _Paces
    compute: ComputeThread
    entry: EntryModel
    alone: Shard  # the same layers, for each step run alone
    messages: list[StepMessage]


@pytest.fixture(params=["int8", "float32"])
def hop(request: pytest.FixtureRequest, tiny_runtime: RuntimeConfig) -> Iterator[_Hop]:
    """A hop serving every layer of the tiny model, each session prefilled, and the three
    steps that arrive together. int8 computes each row alone (swarm's kernels); float32 sums
    rows on torch's products, where a verify step's rows run apart."""
    runtime = dataclasses.replace(tiny_runtime, dtype=request.param)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    serving = Serving()
    serving.move_to(Shard.load(context, span, runtime))
    alone = Shard.load(context, span, runtime)
    route = (Hop(ME, "127.0.0.1:1", span),)
    messages = []
    for session, (prompt, tokens) in STEPS.items():
        for shard in (*serving.all(), alone):
            shard.forward(SessionId(session), entry.embed(prompt), 0)
        hidden = entry.embed(tokens)
        verify = len(tokens) > 1
        messages.append(
            StepMessage(SessionId(session), 1, len(prompt), hidden, route, ENTRY, verify=verify)
        )
    compute = ComputeThread(threads=1)
    sent, speed = _Sent(), _Paces(1.0, StepCost(0.1, 1.0, 0.1))
    batcher = DecodeBatcher(compute, serving, max_batch=8)
    core = HopCore(ME, serving, sent, HopLedger(ME, speed))  # type: ignore[arg-type]
    server = HopServer(core, compute, batcher)
    try:
        yield _Hop(server, sent, speed, compute, entry, alone, messages)
    finally:
        compute.close()


def _check_results(hop: _Hop) -> None:
    """Every step's result is what it gives alone: a decode step's the bits of `forward` (to
    float rounding where torch sums a batch's rows), a verify step's every row the bits of
    one-position steps."""
    results = {m.session: m for m in hop.sent.messages}
    assert sorted(results) == sorted(STEPS)
    for message in hop.messages:
        result = results[message.session]
        assert isinstance(result, ResultMessage) and result.verify == message.verify
        session, hidden, at = message.session, message.hidden, message.position
        rows = [
            hop.alone.forward(session, hidden[:, i : i + 1], at + i) for i in range(len(hidden[0]))
        ]
        want = torch.cat(rows, dim=1)
        if message.verify or hop.alone.context.int8:
            assert torch.equal(result.hidden, want), message.session
        else:
            torch.testing.assert_close(result.hidden, want)
    # one call: every step waited and computed for the same time
    assert len({m.timings[0].compute for m in results.values()}) == 1


def _pace_samples(hop: _Hop) -> list[tuple[int, int]]:
    """What the call should have fed the decode pace: its rows where they shared each layer's
    call (swarm's kernels), nothing where the verify step's rows ran one after the other."""
    layers = len(hop.alone.span)
    return [(layers, ROWS)] if hop.alone.context.int8 else []


async def test_the_hop_batcher_runs_a_verify_step_with_the_decode_steps_beside_it(
    hop: _Hop,
) -> None:
    await asyncio.gather(*(hop.hop.step(m, 0.0, time.perf_counter()) for m in hop.messages))
    batcher = hop.hop.batcher
    assert batcher is not None and (batcher.batches, batcher.jobs) == (1, 3)
    _check_results(hop)
    assert hop.speed.decodes == _pace_samples(hop)


async def test_the_compute_thread_runs_a_verify_step_from_a_fast_link_with_the_decode_steps(
    hop: _Hop,
) -> None:
    """The frames of one round of reads (handed to `take` on the compute thread, as the
    fast-link reader does) run in one call; with no fast link open, the results go through
    the event loop's links."""
    config = NetConfig()
    codec = FrameCodec(SwarmKeys.loopback().frame, ME)
    loop = asyncio.get_running_loop()
    core = hop.hop.core
    gate = LeavingGate(hop.hop, core.links, lambda: True)
    inbox = Inbox(codec, config, loop)
    # no entry of its own here: its head claims no result, and it plans no step
    nobody = EntryHead(hop.entry, hop.compute)
    entry = OwnEntry(nobody, lambda: 0, StepsAhead(StepWaiters(), count(), loop))
    steps = ThreadSteps(core, gate, inbox, core.links, loop, hop.compute, entry, max_batch=8)

    def one_round() -> None:
        for message in hop.messages:
            steps.take(Received(ENTRY.node_id, 1, message), 0.0, time.perf_counter())
        steps.flush()

    await hop.compute.run(one_round)
    assert (steps.batches, steps.steps) == (1, 3)
    await until(
        lambda: len(hop.sent.messages) >= len(STEPS),
        lambda: f"every step's result sent (sent: {hop.sent.messages})",
        30,
        every_s=0.01,
    )
    _check_results(hop)
    await asyncio.sleep(0)  # the pace sample comes through the event loop
    assert hop.speed.decodes == _pace_samples(hop)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_verify_step_joins_the_heads_batch_and_picks_what_it_picks_alone(
    tiny_runtime: RuntimeConfig, dtype: str
) -> None:
    """int8's head computes rows alone: every row of the batch is one product; float32's sums
    them, and a verify step's rows each get a product of their own, as alone."""
    runtime = dataclasses.replace(tiny_runtime, dtype=dtype)  # type: ignore[arg-type]
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
    histories = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    outs = [shard.forward(SessionId(f"s{i}"), entry.embed(h), 0) for i, h in enumerate(histories)]
    # the verify step's drafts: what greedy picks at each of its rows, so every one is kept
    drafts = [int(t) for t in entry.row_logits(outs[1][:, -4:-1]).argmax(-1)]
    verify_hidden = outs[1][:, -4:]
    greedy = SamplingSettings(temperature=0.0)

    def jobs() -> list[HeadJob]:
        return [
            HeadJob(SessionId(f"s{i}"), Sampler(greedy, len(h)), out[:, -1:], h)
            for i, (h, out) in enumerate(zip(histories, outs, strict=True))
        ]

    async def together(head: EntryHead) -> tuple[Any, ...]:
        plain = jobs()
        return await asyncio.gather(
            head.sample(plain[0]),
            head.verify(dataclasses.replace(plain[1], hidden=verify_hidden), drafts),
            head.sample(plain[2]),
        )

    compute = ComputeThread(threads=1)
    try:
        head = EntryHead(entry, compute, max_batch=8)
        first, picks, third = asyncio.run(together(head))
        assert (head.batcher.batches, head.batcher.jobs) == (1, 3)
        alone = EntryHead(entry, compute)
        plain = jobs()
        job = dataclasses.replace(plain[1], hidden=verify_hidden)
        picks_alone = asyncio.run(alone.verify(job, drafts))
        first_alone = asyncio.run(alone.sample(plain[0]))
    finally:
        compute.close()
    assert picks == picks_alone and len(picks) == len(drafts) + 1
    assert [p.token for p in picks[:-1]] == drafts
    assert first.token == first_alone.token
    assert third.token == int(entry.logits(outs[2]).argmax())
    assert head.drafts.accepted == len(drafts)
