"""`swarm doctor`: checks a running swarm from any machine and says, one line each, what is
wrong and how to fix it. `gather` observes (the thin async shell), `checks` judges (pure
functions over what was observed), `report` prints."""

from __future__ import annotations

from swarm.doctor.checks import diagnose, failed
from swarm.doctor.gather import Budget, gather
from swarm.doctor.report import as_json, as_lines

__all__ = ["Budget", "as_json", "as_lines", "diagnose", "failed", "gather"]
