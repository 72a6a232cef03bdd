"""Where benchmarks and tests keep what is slow to make: the converted models and the seeded
GGUF fixtures, kept between runs under the repository's .cache unless SWARM_TEST_CACHE says
otherwise."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Converting the real model takes ~20 s; keep the cache between runs unless told otherwise.
MODEL_CACHE = Path(os.environ.get("SWARM_TEST_CACHE", REPO / ".cache" / "models"))
FIXTURES = MODEL_CACHE.parent / "fixtures"  # harness.gguf_fixture's files
