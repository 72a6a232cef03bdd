"""Several models in one swarm, as tables: which members plan and route each model, the
models the swarm lists with their coverage and entries, and which one a request names."""

from __future__ import annotations

import dataclasses

import pytest

from harness.factories import MODEL, member
from swarm import placement
from swarm.config import PlacementConfig
from swarm.errors import FrameError
from swarm.membership.wire_format import (
    MAX_MODEL_NAME_CHARS,
    MAX_MODEL_NAMES,
    record_from_wire,
    record_to_wire,
)
from swarm.model_routing import members_of, named, served_models
from swarm.runtime.checkpoint.source import served_names
from swarm.schema import Coverage, ServedModel
from swarm.types import Load, MemberRecord, ModelId
from swarm.wire.fields import Fields

CODER = ModelId("c0de" * 6)  # a second model's id


def chat(name: str, span: tuple[int, int] | None = None, **fields: object) -> MemberRecord:
    return member(name, span, **{"names": ("chat", "smol"), **fields})


def coder(name: str, span: tuple[int, int] | None = None, **fields: object) -> MemberRecord:
    return member(name, span, **{"model_id": CODER, "num_layers": 4, "names": ("coder",), **fields})


# ---- the per-model planning filter -------------------------------------------------------

FILTERED = [
    # (what, members, the model, the members that plan it)
    ("one model", [chat("a"), chat("b")], MODEL, ["a", "b"]),
    ("another model's members left out", [chat("a"), coder("b"), chat("c")], MODEL, ["a", "c"]),
    ("the other model sees only its own", [chat("a"), coder("b"), chat("c")], CODER, ["b"]),
    ("a model nobody serves", [chat("a")], CODER, []),
]


@pytest.mark.parametrize(
    ("what", "records", "model", "kept"), FILTERED, ids=[f[0] for f in FILTERED]
)
def test_a_model_is_planned_among_its_own_members_only(
    what: str, records: list[MemberRecord], model: ModelId, kept: list[str]
) -> None:
    assert [r.node_id for r in members_of(records, model)] == kept


def test_placement_of_one_model_never_gives_layers_to_a_member_of_another() -> None:
    """The coder's node is the fastest and holds every layer; the chat model's plan among
    its own members still leaves it out, and a hole stays a hole."""
    records = [chat("a", layers=15), chat("b", layers=15), coder("fast", ms=0.01, layers=100)]
    plan = placement.plan(members_of(records, MODEL), 30, PlacementConfig())
    assert {node for node, span in plan.spans if span is not None} == {"a", "b"}
    alone = placement.evaluate(members_of([chat("a", (0, 10)), coder("b", (0, 4))], MODEL), 30)
    assert [(s.start, s.end) for s in alone.missing] == [(10, 30)]


# ---- the models a swarm lists ------------------------------------------------------------


def test_every_model_is_listed_with_its_own_coverage_and_entries_by_load() -> None:
    here = chat("a", (0, 30), load=Load(active_sessions=3))
    alive = [
        here,
        chat("b", (0, 30)),
        coder("c", (0, 2), load=Load(queue_depth=1)),
        coder("d", (2, 4)),
        coder("e", (0, 4), draining=True),  # leaving: covers, takes no new requests
    ]
    own, other = served_models(alive, here)
    assert (own.name, own.aliases, own.here, own.layers) == ("chat", ("smol",), True, 30)
    assert own.coverage.complete and own.entries == ("b:7070", "a:7070")
    assert (other.name, other.model_id, other.here, other.layers) == ("coder", CODER, False, 4)
    assert other.coverage.complete and other.entries == ("d:7070", "c:7070")


def test_a_model_with_a_hole_names_its_missing_layers_and_the_other_stays_whole() -> None:
    here = coder("c", (0, 4))
    own, other = served_models([chat("a", (0, 10)), here], here)
    assert (own.name, own.coverage.complete) == ("coder", True)
    assert other.name == "chat"
    assert (other.coverage.complete, other.coverage.missing) == (False, ((10, 30),))


def test_a_member_that_gives_no_name_lists_its_model_by_id() -> None:
    here = chat("a", (0, 30))
    _, unnamed = served_models([here, coder("b", (0, 4), names=())], here)
    assert (unnamed.name, unnamed.aliases) == (CODER, ())


# ---- which model a request names ---------------------------------------------------------

COVERED = Coverage(True, (), 30, 1.0)
MODELS = (
    ServedModel("chat", MODEL, 30, COVERED, ("smol",), here=True),
    ServedModel("coder", CODER, 4, COVERED),
    ServedModel("llama3.2:3b", ModelId("ab" * 12), 28, COVERED),
)

NAMED = [
    # (what the request's model says, the model it names, or None)
    ("chat", "chat"),
    ("smol", "chat"),  # an alias
    ("chat:latest", "chat"),  # as Ollama lists it
    ("smol:latest", "chat"),
    (MODEL, "chat"),  # the id
    (MODEL[:8], "chat"),  # an 8-digit prefix of it
    (CODER[:12], "coder"),
    ("coder", "coder"),
    ("llama3.2:3b", "llama3.2:3b"),
    ("llama3.2:3b:latest", None),  # a tagged name takes no second tag
    (MODEL[:7], None),  # too short a prefix
    ("gpt-4o", None),
    ("Chat", None),  # names are exact
    ("", None),
]


@pytest.mark.parametrize(("asked", "found"), NAMED, ids=[n[0] or "empty" for n in NAMED])
def test_a_request_names_a_model_by_name_alias_or_id(asked: str, found: str | None) -> None:
    model = named(MODELS, asked)
    assert (None if model is None else model.name) == found


def test_an_id_prefix_two_models_share_names_neither() -> None:
    twins = (
        dataclasses.replace(MODELS[1], model_id=ModelId("12345678aa")),
        dataclasses.replace(MODELS[2], model_id=ModelId("12345678bb")),
    )
    assert named(twins, "12345678") is None
    assert named(twins, "12345678b") is twins[1]


# ---- the names travel in the member record -----------------------------------------------


def test_the_names_of_a_members_model_travel_in_its_record() -> None:
    for names in ((), ("chat",), ("chat", "smol")):
        sent = member("a", names=names)
        assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        ([f"n{i}" for i in range(MAX_MODEL_NAMES + 1)], "more than"),
        ([""], "strings of 1 to"),
        (["x" * (MAX_MODEL_NAME_CHARS + 1)], "strings of 1 to"),
        ([7], "strings of 1 to"),
    ],
    ids=["too many", "empty", "too long", "not a string"],
)
def test_names_a_peer_cannot_give_are_refused(names: list[object], fragment: str) -> None:
    fields = {**record_to_wire(member("a")), "names": names}
    with pytest.raises(FrameError, match=fragment):
        record_from_wire(Fields(fields, "record"))


# ---- the names a node gives its model ----------------------------------------------------

SERVED_NAMES = [
    # (api.served_model_name, the reference the model's index was made from, the names)
    ("", "smollm2-135m-instruct", ("smollm2-135m-instruct",)),
    ("chat", "smollm2-135m-instruct", ("chat", "smollm2-135m-instruct")),
    ("", "/models/Qwen3-8B-Q4_K_M.gguf", ("Qwen3-8B-Q4_K_M",)),
    ("Qwen3-8B-Q4_K_M", "/models/Qwen3-8B-Q4_K_M.gguf", ("Qwen3-8B-Q4_K_M",)),
    ("", "Qwen/Qwen3-8B-GGUF:Qwen3-8B-Q4_K_M.gguf", ("Qwen3-8B-Q4_K_M",)),
]


@pytest.mark.parametrize(("served", "indexed_from", "names"), SERVED_NAMES)
def test_a_node_names_its_model_from_its_index_never_from_the_id_it_was_started_with(
    served: str, indexed_from: str, names: tuple[str, ...]
) -> None:
    assert served_names(served, indexed_from) == names
