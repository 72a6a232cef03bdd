"""`response_format` as a grammar: `json_object` and `json_schema` become llguidance grammars
the entry enforces token by token, so the answer always parses (and validates against the
schema). Checked here, without the model, so an invalid schema is a 400 before anything
reaches the swarm."""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher

from swarm.api.errors import ApiError, bad_request

# Fixed separators, as json.dumps writes them: a model cannot pad the answer with endless
# whitespace while still inside the grammar.
_JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def json_grammar(schema: Any, field: str, what: str = "the JSON schema") -> str:
    """The grammar of JSON text that validates against `schema`, or a 400 naming `field`."""
    if not isinstance(schema, dict):
        raise bad_request(f"{what} must be a JSON object", field)
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as e:
        raise bad_request(f"{what} is invalid: {e}", field) from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise bad_request(f"{what} is invalid: {messages[0] if messages else ''}", field)
    return grammar


def response_format(body: dict[str, Any]) -> str | None:
    """OpenAI's response_format: text (None), json_object, or json_schema with its schema."""
    value = body.get("response_format")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return json_grammar(ANY_OBJECT, "response_format")
    if kind == "json_schema" and set(value) == {"type", "json_schema"}:
        return _json_schema(value["json_schema"])
    raise _format_error()


def _json_schema(spec: Any) -> str:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _format_error()
    unknown = set(spec) - {"name", "description", "schema", "strict"}
    if unknown:
        raise bad_request(
            f"unknown field {sorted(unknown)[0]!r} in response_format.json_schema",
            "response_format",
        )
    # strict or not, the schema is enforced: a looser promise kept strictly is still kept
    return json_grammar(spec.get("schema", ANY_OBJECT), "response_format")


def _format_error() -> ApiError:
    return bad_request(
        'response_format must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
        "response_format",
    )
