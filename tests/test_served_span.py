"""The span a node served, kept beside its id so a node started again asks for it back: the
file's round trip, what it refuses, and the record field that carries it to the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.factories import MODEL, member
from swarm.membership.served_span import read_served_span, span_file, write_served_span
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.types import LayerSpan, ModelId
from swarm.wire.fields import Fields


def test_the_span_written_is_the_span_read_back(tmp_path: Path) -> None:
    path = span_file(tmp_path, 7420)
    write_served_span(path, MODEL, LayerSpan(11, 22))
    assert read_served_span(path, MODEL, 30) == LayerSpan(11, 22)
    write_served_span(path, MODEL, LayerSpan(0, 11))  # the newest one wins
    assert read_served_span(path, MODEL, 30) == LayerSpan(0, 11)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no file: a first start"),
        ('{"model": "another", "span": [0, 11]}', "another model's"),
        ('{"model": "%s", "span": [20, 40]}', "outside the model"),
        ('{"model": "%s", "span": [5]}', "not a span"),
        ('{"model": "%s"', "torn"),
        ("[1, 2]", "not an object"),
    ],
)
def test_what_cannot_be_a_span_of_this_model_is_no_preference(
    tmp_path: Path, text: str | None, why: str
) -> None:
    path = span_file(tmp_path, 7420)
    assert path is not None
    if text is not None:
        path.write_text(text.replace("%s", MODEL))
    assert read_served_span(path, MODEL, 30) is None, why


def test_a_node_on_an_ephemeral_port_keeps_no_span(tmp_path: Path) -> None:
    assert span_file(tmp_path, 0) is None
    write_served_span(None, ModelId("m"), LayerSpan(0, 1))  # nothing to write, no error
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_refuses_loses_the_preference_not_the_node(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    write_served_span(blocked / "node-7420.span", MODEL, LayerSpan(0, 1))  # a file as folder


def test_the_span_a_node_resumes_travels_in_its_record() -> None:
    for resumes in (None, LayerSpan(11, 22)):
        sent = member("a", resumes=resumes)
        assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent


def test_the_reloads_a_node_made_travel_in_its_record_and_none_is_no_field() -> None:
    for reloads in (0, 3):
        sent = member("a", reloads=reloads)
        fields = record_to_wire(sent)
        assert ("reloads" in fields) == (reloads > 0)  # what an older peer sends: nothing
        assert record_from_wire(Fields(fields, "record")) == sent
