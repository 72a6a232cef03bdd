"""Several models in one swarm, as pure functions over member records: the members that plan
and route each model (only those serving it), the models the swarm serves with their coverage,
their entries and the copies holding them whole, which of them a request's `model` names, and
whether a request runs here or on a less loaded copy."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from swarm import placement
from swarm.schema import Copy, Coverage, ServedModel
from swarm.types import MemberRecord, ModelId

MIN_ID_PREFIX = 8  # hex digits of a model id that name it, as `swarm node --model` takes them
# a request goes to another copy only where its tokens are expected this fraction sooner
# there: the forward costs a connection and a relay, and equal copies keep their requests
SPREAD_GAIN = 0.1


def ollama_name(name: str) -> str:
    """A model's name as Ollama lists it: a name without a tag gets Ollama's `:latest`."""
    return name if ":" in name.rpartition("/")[2] else f"{name}:latest"


def members_of(records: Iterable[MemberRecord], model_id: ModelId) -> tuple[MemberRecord, ...]:
    """The members placement and routing plan `model_id` with: those serving it, and no
    other. A member of another model never gets its layers nor counts in its coverage."""
    return tuple(r for r in records if r.model_id == model_id)


def coverage(records: Sequence[MemberRecord], num_layers: int) -> Coverage:
    """Which of a model's layers `records` (its live members, of that model only) serve."""
    current = placement.evaluate(records, num_layers)
    limit = placement.limiting(current)
    return Coverage(
        complete=not current.missing,
        missing=tuple((s.start, s.end) for s in current.missing),
        covered_layers=current.covered,
        bottleneck_tokens_per_s=round(current.bottleneck, 3),
        limiting_layers=None if limit is None else (limit[0].start, limit[0].end),
        limited_by=() if limit is None else tuple(limit[1]),
        route_ms=None if current.latency_ms is None else round(current.latency_ms, 3),
    )


def served_models(alive: Sequence[MemberRecord], here: MemberRecord) -> tuple[ServedModel, ...]:
    """Every model `alive` members serve (the node `here` among them), its own first, then by
    name. A model's name is the first name its members give, `here`'s own for its model;
    its entries are its members that take requests, least loaded first."""
    records = [here, *(r for r in alive if r.node_id != here.node_id)]  # its newest record
    ids = dict.fromkeys(r.model_id for r in records)
    models = [_served(members_of(records, m), here) for m in ids]
    return (models[0], *sorted(models[1:], key=lambda m: (m.name, m.model_id)))


def _served(records: Sequence[MemberRecord], here: MemberRecord) -> ServedModel:
    names = dict.fromkeys(n for r in records for n in r.names)
    name, *aliases = names or [records[0].model_id]
    takers = sorted(
        (r for r in records if not r.draining),
        key=lambda r: (r.load.active_sessions + r.load.queue_depth, r.node_id),
    )
    first = records[0]
    return ServedModel(
        name=name,
        model_id=first.model_id,
        layers=first.num_layers,
        coverage=coverage(records, first.num_layers),
        aliases=tuple(aliases),
        entries=tuple(r.address for r in takers),
        here=first.model_id == here.model_id,
        copies=tuple(_copy(r, here) for r in takers if _whole(r)),
    )


def _whole(record: MemberRecord) -> bool:
    """Whether it holds every layer of its model and has measured its pace."""
    span, ms = record.span, record.capacity.ms_per_layer_decode
    whole = span is not None and span.start == 0 and span.end == record.num_layers
    return whole and math.isfinite(ms) and ms > 0


def _copy(record: MemberRecord, here: MemberRecord) -> Copy:
    return Copy(
        address=record.address,
        ms_per_token=record.capacity.ms_per_layer_decode * record.num_layers,
        load=record.load.active_sessions + record.load.queue_depth,
        here=record.node_id == here.node_id,
    )


def spread(model: ServedModel, load_here: int, sent: Mapping[str, int]) -> str | None:
    """Where a request for `model`, which this node holds whole, runs: None here, else the
    address of the copy whose tokens come `SPREAD_GAIN` sooner. `load_here`: the requests
    for it this node answers now (its own count, fresher than gossip); `sent`: the
    requests this node has sent to each copy and that still run there, which its gossiped
    load may not show yet. A token's time on a copy is its pace times the sessions it would
    run with this one (a decode step's rows share the machine). A lone request stays here."""
    mine = next((c for c in model.copies if c.here), None)
    others = [c for c in model.copies if not c.here]
    if mine is None or load_here <= 0 or not others:
        return None

    def token_ms(copy: Copy) -> tuple[float, str]:
        load = max(copy.load, sent.get(copy.address, 0))
        return copy.ms_per_token * (1 + load), copy.address

    ms, address = min(map(token_ms, others))
    return address if ms < mine.ms_per_token * (1 + load_here) * (1 - SPREAD_GAIN) else None


def named(models: Sequence[ServedModel], asked: str) -> ServedModel | None:
    """The model `asked` names: its name or an alias (either as given or as Ollama lists
    it), its id, or a prefix of its id of 8 or more hex digits that no other id shares;
    None when none does."""
    for model in models:
        names = (model.name, *model.aliases)
        if asked == model.model_id or asked in (*names, *map(ollama_name, names)):
            return model
    if len(asked) < MIN_ID_PREFIX:
        return None
    prefixed = [m for m in models if m.model_id.startswith(asked)]
    return prefixed[0] if len(prefixed) == 1 else None
