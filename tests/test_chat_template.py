"""A GGUF file's chat template rendered as transformers renders one (swarm does it without
transformers for GGUF files): the same text for templates that use tools, tojson, loop
controls, namespaces and raise_exception, and the same sandbox."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from swarm.runtime.text.chat_template import render_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city, in °C",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "Wetter in Zürich? <tag> & \"quotes\""},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
    ]},
    {"role": "tool", "content": "sunny"},
]  # fmt: skip
TEMPLATES = {
    "tools as JSON": (
        "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}\n  {% if m.role == 'assistant' and m.tool_calls %}"
        "{% for c in m.tool_calls %}CALL {{ c.function.name }} "
        "{{ c.function.arguments | tojson(indent=2) }}"
        "{% endfor %}{% else %}[{{ m.role }}] {{ m.content }}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    ),
    "loop controls and a namespace": (
        "{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}{{ bos_token }}{{ m.role }}: {{ m.content }}"
        "{{ eos_token }}{% endfor %}system was {{ ns.system }}"
    ),
}  # fmt: skip


def _transformers(template: str, **variables: Any) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [MESSAGES], chat_template=template, add_generation_prompt=True, **variables
    )
    return str(rendered[0])


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_text_is_transformers(name: str) -> None:
    template = TEMPLATES[name]
    variables = {"tools": TOOLS, "bos_token": "<s>", "eos_token": "</s>"}
    assert render_template(template, MESSAGES, **variables) == _transformers(template, **variables)


def test_a_template_that_raises_is_a_template_error() -> None:
    template = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system here') }}{% endif %}"
    )
    with pytest.raises(jinja2.TemplateError, match="no system here"):
        render_template(template, MESSAGES)


def test_a_template_cannot_reach_python() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_template("{{ messages.append({'role': 'x'}) }}", MESSAGES)
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_template("{{ ''.__class__.__mro__ }}", MESSAGES)
