"""A chat template (Jinja) rendered the way transformers renders one: a sandbox whose values
cannot be changed, blocks' newlines trimmed and their indentation stripped, `tojson` without
HTML escaping, `raise_exception` and `strftime_now`, loop controls. Templates come from model
files, which anyone can publish: the sandbox keeps them from reaching Python's internals."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def render_template(
    template: str,
    messages: Sequence[dict[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """`template` rendered for `messages`; `variables` are the rest it may read (tools,
    bos_token, eos_token). Raises jinja2.TemplateError when the template refuses them."""
    return _compiled(template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
    )


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
