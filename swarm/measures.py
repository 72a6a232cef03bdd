"""Counters and levels declared where they are reported: a status record's field carries its
metric in its type (`Annotated[int, counter(...)]`), and /metrics is read off the records by
`families`, so a new counter is one field in `swarm/schema.py`. `summed` adds records of
counters up, field by field (a node's shards, its batchers). Pure: no prometheus here; the HTTP
layer turns `Family`s into its exposition format."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_type_hints

Kind = Literal["gauge", "counter"]  # a level read now, or a count since the node started
R = TypeVar("R")


@dataclass(frozen=True)
class Measure:
    """How one field shows in /metrics. A field of numbers is one sample (a bool is 0 or 1, a
    tuple its length, None none); a dict field is one sample per key, under `label`. Fields
    that share a name are one family: each gives its sample's `label` a fixed `value`."""

    name: str  # as scraped; a counter's samples get prometheus' `_total`
    help: str
    kind: Kind
    label: str | None = None  # the family's one label, if it has one
    value: str | None = None  # this field's value of it; None: a dict field's keys
    scale: float = 1.0  # what the field's unit is multiplied by (ms to seconds: 1e-3)

    def at(self, value: str) -> Measure:
        """This family's sample for the field whose `label` is `value`."""
        return dataclasses.replace(self, value=value)


def gauge(name: str, help: str, label: str | None = None, scale: float = 1.0) -> Measure:
    return Measure(name, help, "gauge", label, scale=scale)


def counter(name: str, help: str, label: str | None = None) -> Measure:
    return Measure(name, help, "counter", label)


@dataclass(frozen=True)
class Family:
    """One metric as /metrics shows it: its samples by the value of its label (None when it
    has none)."""

    name: str
    help: str
    kind: Kind
    label: str | None
    samples: tuple[tuple[str | None, float], ...]


def families(record: object) -> tuple[Family, ...]:
    """The metrics the fields of `record` and of the records inside it declare, in the order
    they are declared; a family that several fields share appears once, with each field's
    sample. TypeError when two declarations of one name disagree."""
    found: dict[str, Family] = {}
    for m, samples in _measured(record):
        family = found.get(m.name, Family(m.name, m.help, m.kind, m.label, ()))
        if (family.help, family.kind, family.label) != (m.help, m.kind, m.label):
            raise TypeError(f"the metric {m.name} is declared two different ways")
        found[m.name] = dataclasses.replace(family, samples=family.samples + samples)
    return tuple(found.values())


def summed(kind: type[R], records: Iterable[R]) -> R:
    """One record of type `kind` whose every field is the sum of that field over `records`
    (none: `kind`'s defaults). Only for records of numbers: TypeError names a field that
    is not one."""
    totals = {f.name: getattr(kind(), f.name) for f in _fields(kind)}
    for name, total in totals.items():
        if isinstance(total, bool) or not isinstance(total, (int, float)):
            raise TypeError(f"{kind.__name__}.{name} is not a number to add up")
    for record in records:
        for name in totals:
            totals[name] += getattr(record, name)
    return kind(**totals)


Samples = tuple[tuple[str | None, float], ...]


def _measured(record: object) -> Iterator[tuple[Measure, Samples]]:
    kind = type(record)
    for name, measure in _declared(kind):
        value = getattr(record, name)
        if measure is not None:
            yield measure, _samples(measure, value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _measured(value)


def _samples(measure: Measure, value: Any) -> Samples:
    if isinstance(value, dict):
        return tuple((str(k), float(v) * measure.scale) for k, v in value.items())
    if value is None:
        return ()
    if isinstance(value, (tuple, list)):
        value = len(value)
    return ((measure.value, float(value) * measure.scale),)


def _declared(kind: type) -> tuple[tuple[str, Measure | None], ...]:
    """Each field of the record type `kind`, with the Measure its type declares, if any."""
    if not dataclasses.is_dataclass(kind):
        return ()
    hints = get_type_hints(kind, vars(sys.modules[kind.__module__]), include_extras=True)
    declared = []
    for f in dataclasses.fields(kind):
        extras = getattr(hints[f.name], "__metadata__", ())  # Annotated's, after the type
        measure = next((e for e in extras if isinstance(e, Measure)), None)
        declared.append((f.name, measure))
    return tuple(declared)


def _fields(kind: type) -> tuple[dataclasses.Field[Any], ...]:
    if not dataclasses.is_dataclass(kind):
        raise TypeError(f"{kind.__name__} is not a record")
    return dataclasses.fields(kind)
