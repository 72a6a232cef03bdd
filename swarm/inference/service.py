"""The node's inference service as the HTTP layer sees it: requests in its terms, answers as
text deltas. Routes each request through the swarm (RemotePipeline) from this entry."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, cast

from swarm.api.backend import Done, GenerationRequest, Health, TextDelta
from swarm.errors import NodeLeavingError, SamplingError
from swarm.inference.generation import Chunk, Finish, generate
from swarm.inference.pipeline import Pipeline
from swarm.runtime.compute import ComputeThread
from swarm.runtime.entry import EntryModel
from swarm.runtime.sampling import SamplingParams
from swarm.types import SessionId


class InferenceService:
    def __init__(
        self,
        model_name: str,
        entry: EntryModel,
        pipeline: Pipeline,
        compute: ComputeThread,
        status: Callable[[], dict[str, Any]],
        max_prompt_tokens: int,
    ) -> None:
        self.model_name = model_name
        self._entry = entry
        self._pipeline = pipeline
        self._compute = compute
        self._status = status
        self._max_prompt_tokens = max_prompt_tokens
        self.accepting = True  # False once the node is leaving
        self.in_flight = 0  # requests generating now, counted until their last event is out

    def _check_accepting(self) -> None:
        if not self.accepting:
            raise NodeLeavingError("this node is shutting down; send the request to another node")

    def _encode(self, request: GenerationRequest) -> list[int]:
        if request.messages is not None:
            return self._entry.encode_chat(request.messages)
        return self._entry.encode_text(request.prompt or "")

    def prompt_tokens(self, request: GenerationRequest) -> int:
        self._check_accepting()
        _params(request)
        n = len(self._encode(request))
        if n + request.max_tokens > self._max_prompt_tokens:
            raise SamplingError(
                f"the prompt ({n} tokens) plus max_tokens ({request.max_tokens}) exceeds the "
                f"model's context of {self._max_prompt_tokens} tokens"
            )
        return n

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TextDelta | Done, None]:
        """Closing this generator early closes the inner one at once (not whenever it is
        garbage-collected), and that closes the session on every hop."""
        self._check_accepting()
        self.in_flight += 1
        try:
            ids = self._encode(request)
            session = SessionId(uuid.uuid4().hex)
            params = _params(request)
            finish: Finish | None = None
            events = cast(  # an async generator function, annotated as an iterator
                AsyncGenerator[Chunk | Finish, None],
                generate(self._entry, self._pipeline, self._compute, ids, params, session),
            )
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, Chunk):
                        yield TextDelta(event.text)
                    else:
                        finish = event  # the trace is complete once the session has closed
            if finish is not None:
                trace = self._trace(session)
                yield Done(finish.reason, finish.prompt_tokens, finish.completion_tokens, trace)
        finally:
            self.in_flight -= 1

    def _trace(self, session: SessionId) -> dict[str, Any] | None:
        trace = getattr(self._pipeline, "finished", {}).get(session)
        if trace is None:
            return None
        route = [
            {"node": h.node_id, "address": h.address, "layers": [h.span.start, h.span.end]}
            for h in trace.route.hops
        ]
        timings = [
            {"node": t.node_id, "queue": t.queue_ms, "compute": t.compute_ms, "wire": t.wire_ms}
            for t in trace.timings
        ]
        failovers = [
            {
                "failed": f.failed,
                "reason": f.reason,
                "detected_at": f.detected_at,
                "waited_ms": f.waited_ms,
                "replay_ms": f.replay_ms,
                "replay_tokens": f.replay_tokens,
            }
            for f in trace.failovers
        ]
        return {"route": route, "hop_timings_ms": timings, "failovers": failovers}

    def status(self) -> dict[str, Any]:
        return self._status()

    def health(self) -> Health:
        if not self.accepting:
            return Health(False, "this node is leaving the swarm")
        missing = tuple((a, b) for a, b in self._status()["coverage"]["missing"])
        if missing:
            spans = ", ".join(f"{a}:{b}" for a, b in missing)
            return Health(False, f"no live node serves layers {spans}", missing)
        return Health(True)


def _params(request: GenerationRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_k=request.top_k,
        top_p=max(request.top_p, 1e-6),  # top_p 0 keeps only the most likely token
        repetition_penalty=request.repetition_penalty,
        seed=request.seed,
        stop=request.stop,
    )
