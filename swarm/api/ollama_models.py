"""The model as Ollama's /api/tags, /api/show and /api/ps describe theirs, and /api/version,
built from the backend's `ModelDetails`. A node serves one model and keeps it loaded: it is
the one running, and never expires; /api/tags lists the models other members serve too."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from swarm.api.ollama_fields import DEFAULTS
from swarm.model_routing import ollama_name
from swarm.schema import ModelDetails, ServedModel

# The Ollama release whose API these routes follow (the first with logprobs): clients that
# check the version for a feature find every feature here in it.
OLLAMA_VERSION = "0.12.11"
# /api/ps's expires_at: the model never unloads (Ollama writes a far date for keep_alive -1)
_NEVER = "9999-12-31T23:59:59Z"
# what any served model can do here: tools go through its template, or swarm's generic prompt
_CAPABILITIES = ["completion", "tools"]


def timestamp(unix: float) -> str:
    """RFC 3339 in UTC, as Ollama writes its times."""
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def tags(model: ModelDetails, others: Sequence[ServedModel] = ()) -> dict[str, Any]:
    """This node's model, then those other members serve, of which it knows the name and
    the id (its digest); what they are (family, size) their own nodes' /api/show tells."""
    return {"models": [_listed(model), *(_elsewhere(m) for m in others)]}


def running(model: ModelDetails) -> dict[str, Any]:
    """/api/ps. `size` is the whole model's; the swarm holds it across its nodes."""
    entry = {
        **_listed(model),
        "expires_at": _NEVER,
        "size_vram": 0,
        "context_length": model.context_tokens,
    }
    del entry["modified_at"]
    return {"models": [entry]}


def show(model: ModelDetails) -> dict[str, Any]:
    parameters = "\n".join(f"{name} {value:g}" for name, value in DEFAULTS.items())
    family = model.family
    return {
        "license": "",
        "modelfile": f"# served by swarm\nFROM {ollama_name(model.name)}\n"
        + "".join(f"PARAMETER {line}\n" for line in parameters.splitlines()),
        "parameters": parameters,
        "template": model.chat_template,  # a Jinja template, the model's own
        "details": _details(model),
        "model_info": {
            "general.architecture": family,
            "general.parameter_count": model.parameters,
            f"{family}.context_length": model.context_tokens,
            f"{family}.block_count": model.layers,
            f"{family}.embedding_length": model.hidden_size,
        },
        "capabilities": _CAPABILITIES,
        "modified_at": timestamp(model.loaded_unix),
    }


def version() -> dict[str, Any]:
    return {"version": OLLAMA_VERSION}


def _listed(model: ModelDetails) -> dict[str, Any]:
    name = ollama_name(model.name)
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp(model.loaded_unix),
        "size": model.size_bytes,
        "digest": model.digest,
        "details": _details(model),
    }


def _elsewhere(model: ServedModel) -> dict[str, Any]:
    name = ollama_name(model.name)
    details = {"parent_model": "", "format": "gguf", "family": "", "families": []}
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp(0),
        "size": 0,
        "digest": model.model_id,
        "details": {**details, "parameter_size": "", "quantization_level": ""},
    }


def _details(model: ModelDetails) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": model.format,
        "family": model.family,
        "families": [model.family],
        "parameter_size": parameter_size(model.parameters),
        "quantization_level": model.quantization,
    }


def parameter_size(parameters: int) -> str:
    """As Ollama writes it: 134.5M, 8.0B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= scale:
            return f"{parameters / scale:.1f}{unit}"
    return str(parameters)
