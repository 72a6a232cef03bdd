"""The span a node served, kept in its state folder beside its id (`node-<port>.span`), so
that a node started again asks for the same layers back: its kept prompt blocks on disk are
for that span, its layers are in its store, and a lab restarted whole comes back as it was
instead of re-planning from scratch. Only a preference: the placement gives the span back
where nobody serves those layers now (`placement._keep_and_fill`). A file for another
model, or one that cannot be read, is no preference at all."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from swarm.errors import SpanError
from swarm.types import LayerSpan, ModelId

log = logging.getLogger(__name__)


def span_file(state_dir: Path, port: int) -> Path | None:
    """Where a node on `port` keeps its span; None on an ephemeral port (its id is new each
    run, so nothing of a previous run is its own)."""
    return None if port == 0 else state_dir.expanduser() / f"node-{port}.span"


def read_served_span(path: Path | None, model_id: ModelId, num_layers: int) -> LayerSpan | None:
    """The span written for `model_id`, or None (no file, another model, unreadable)."""
    if path is None or not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        if kept.get("model") != model_id:
            return None
        start, end = kept["span"]
        span = LayerSpan(int(start), int(end))
        span.check_within(num_layers)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SpanError) as e:
        log.warning("ignoring %s (the span this node served before): %s", path, e)
        return None
    return span


def write_served_span(path: Path | None, model_id: ModelId, span: LayerSpan) -> None:
    """Keep `span` as the one served; a disk that refuses loses the preference, nothing else."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model": model_id, "span": [span.start, span.end]}))
        tmp.rename(path)
    except OSError as e:
        log.warning("could not keep the span served in %s: %s", path, e)
