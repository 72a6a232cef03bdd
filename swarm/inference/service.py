"""The node's inference service as the HTTP layer sees it: requests in its terms, answers as
text deltas. One `Generation` per request owns it from its tokens to its trace; the tokens
are made once, on the compute thread, never on the event loop."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import cast

from swarm.api.backend import Done, EmbeddingRequest, Embeddings, GenerationRequest, TextDelta
from swarm.errors import NodeLeavingError, SamplingError, UnsupportedModelError
from swarm.inference.details import model_details
from swarm.inference.embedding import embed_all
from swarm.inference.generation import Chunk, generate
from swarm.inference.head import EntryHead
from swarm.inference.pipeline import Pipeline
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.pooling import pooling_of
from swarm.runtime.text.grammar import TokenConstraint
from swarm.sampling_settings import SamplingSettings
from swarm.schema import RequestTrace
from swarm.types import SessionId

log = logging.getLogger(__name__)


class InferenceService:
    def __init__(
        self,
        model_name: str,
        entry: EntryModel,
        pipeline: Pipeline,
        compute: ComputeThread,
        max_prompt_tokens: int,
        max_batch: int = 1,
        head: EntryHead | None = None,
    ) -> None:
        """`head`: the sessions' shared head, made here from `max_batch` when not given."""
        self.model_name = model_name
        self._entry = entry
        self._pipeline = pipeline
        self._compute = compute
        # shared: sessions batch their heads
        self.head = head or EntryHead(entry, compute, max_batch)
        self._max_batch = max_batch  # an embedding request's inputs in flight together
        self._max_prompt_tokens = max_prompt_tokens
        self.context_tokens = max_prompt_tokens
        self.details = model_details(model_name, entry, max_prompt_tokens)
        self.accepting = True  # False once the node is leaving
        self.in_flight = 0  # requests generating now, counted until their last event is out

    @property
    def embedding_size(self) -> int:
        return self._entry.hidden_size

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        if not self.accepting:
            raise NodeLeavingError("this node is shutting down; send the request to another node")
        try:
            pooling = pooling_of(self._entry.pooling_type)
        except UnsupportedModelError as e:
            raise SamplingError(str(e), "model") from None
        inputs = await self._compute.run(_encode_inputs, self._entry, request.inputs)
        inputs = [self._checked_input(ids, i, request.truncate) for i, ids in enumerate(inputs)]
        self.in_flight += 1
        try:
            vectors = await embed_all(
                self._entry,
                self._pipeline,
                self._compute,
                inputs,
                pooling,
                request.normalize,
                self._max_batch,
            )
        finally:
            self.in_flight -= 1
        return Embeddings(vectors, sum(len(ids) for ids in inputs))

    def _checked_input(self, ids: list[int], i: int, truncate: bool) -> list[int]:
        """An input's tokens: some, each with a row in the embedding, within the context."""
        field = f"input[{i}]"
        if not ids:
            raise SamplingError(f"{field} has no tokens", field)
        vocab = self._entry.vocab_size
        if any(not 0 <= token < vocab for token in ids):
            raise SamplingError(
                f"{field} holds a token id outside the vocabulary [0, {vocab})", field
            )
        if len(ids) > self._max_prompt_tokens:
            if truncate:
                return ids[: self._max_prompt_tokens]
            raise SamplingError(
                f"{field} has {len(ids)} tokens, more than the model's context of "
                f"{self._max_prompt_tokens}",
                field,
            )
        return ids

    async def start(self, request: GenerationRequest) -> Generation:
        if not self.accepting:
            raise NodeLeavingError("this node is shutting down; send the request to another node")
        vocab = self._entry.vocab_size
        settings = request.sampling
        if any(not 0 <= token < vocab for token, _ in settings.logit_bias):
            raise SamplingError(
                f"logit_bias names a token id outside the vocabulary [0, {vocab})", "logit_bias"
            )
        ids = await self._compute.run(_encode, self._entry, request)
        _check_embedding(self._entry, ids, request)
        room = self._max_prompt_tokens - len(ids)
        if room < (settings.max_tokens or 1):
            raise SamplingError(
                f"the prompt ({len(ids)} tokens) plus max_tokens ({settings.max_tokens or 1}) "
                f"exceeds the model's context of {self._max_prompt_tokens} tokens",
                "max_tokens" if settings.max_tokens else _prompt_field(request),
            )
        params = replace(settings, max_tokens=settings.max_tokens or room)
        constraint = (  # compiled once, before anything streams: a bad grammar is a 400
            None
            if params.grammar is None
            else await self._compute.run(self._entry.grammar.constraint, params.grammar)
        )
        return Generation(self, ids, params, constraint)

    def generate(
        self, ids: Sequence[int], params: SamplingSettings, constraint: TokenConstraint | None
    ) -> AsyncGenerator[Chunk | Done]:
        """A new session's generation of `ids` (checked by `start`) on this node's entry."""
        session = SessionId(uuid.uuid4().hex)
        return cast(  # an async generator function, annotated as an iterator
            AsyncGenerator[Chunk | Done, None],
            generate(
                self._entry,
                self._pipeline,
                self._compute,
                ids,
                params,
                session,
                self.head,
                constraint,
            ),
        )


@dataclass
class Generation:
    """One request: its prompt's tokens, its sampling, and, once it finished, its trace."""

    service: InferenceService
    ids: Sequence[int]
    params: SamplingSettings
    constraint: TokenConstraint | None = None  # params.grammar, compiled; used by one run
    trace: RequestTrace | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)

    async def events(self) -> AsyncGenerator[TextDelta | Done, None]:
        """Closing this generator early closes the inner one at once (not whenever it is
        garbage-collected), and that closes the session on every hop."""
        self.service.in_flight += 1
        try:
            inner = self.service.generate(self.ids, self.params, self.constraint)
            async with aclosing(inner) as events:
                async for event in events:
                    if isinstance(event, Chunk):
                        yield TextDelta(
                            event.text, () if event.logprob is None else (event.logprob,)
                        )
                    else:
                        self.trace = event.trace
                        yield event
        finally:
            self.service.in_flight -= 1


def _prompt_field(request: GenerationRequest) -> str:
    return "messages" if request.messages is not None else "prompt"


def _encode_inputs(entry: EntryModel, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Texts tokenized as a completion's prompt is (special tokens added); ids as given."""
    return [entry.encode_text(x) if isinstance(x, str) else list(x) for x in inputs]


def _encode(entry: EntryModel, request: GenerationRequest) -> list[int]:
    if request.messages is not None:
        return entry.encode_chat(request.messages, request.tools)
    return entry.encode_text(request.prompt or "")


def _check_embedding(entry: EntryModel, ids: Sequence[int], request: GenerationRequest) -> None:
    """A token the embedding has no row for is refused before anything runs. The tokenizer
    made it from the request, so it is a bug of the tokenizer or the model file: logged as
    one, and a 400 that names it, since the same prompt would fail on every node."""
    outside = next((i for i in ids if not 0 <= i < entry.vocab_size), None)
    if outside is None:
        return
    text = entry.token_text(outside) if outside >= 0 else ""
    log.error(
        "bug: the tokenizer made token %d (%r) from a prompt, outside the embedding's %d rows",
        outside,
        text,
        entry.vocab_size,
    )
    raise SamplingError(
        f"the prompt tokenizes to token {outside} ({text!r}), which the model's embedding "
        f"({entry.vocab_size} rows) has no row for",
        _prompt_field(request),
    )
