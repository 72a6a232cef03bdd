"""`swarm doctor`'s verdicts as lines for a person (ok, warn or FAIL first) or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from swarm.doctor.facts import Verdict
from swarm.schema import to_json


def as_lines(verdicts: Sequence[Verdict]) -> list[str]:
    return [f"{v.level:<4} {v.check:<17} {v.message}" for v in verdicts]


def as_json(verdicts: Sequence[Verdict]) -> str:
    ok = all(v.level != "FAIL" for v in verdicts)
    return json.dumps({"ok": ok, "verdicts": to_json(tuple(verdicts))}, indent=1)
