"""Where a node finds its config file without being told, the effective config written back
as TOML (what `swarm config` prints), with secrets hidden, and the defaults as the commented
bootstrap.toml the repository ships (`swarm config --defaults`)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import os
import tokenize
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from swarm.config import Config, ModelEntry

CONFIG_FILE_NAME = "bootstrap.toml"
_SECRET_FIELDS = ("token",)  # api.token; secret files are paths and stay visible


def config_search_path(environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Where a node looks for its config file when none is named, first match wins: the
    working directory, the user's config folder ($XDG_CONFIG_HOME or ~/.config), then
    /etc/swarm."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME")
    user = Path(xdg) if xdg else Path.home() / ".config"
    return (
        Path.cwd() / CONFIG_FILE_NAME,
        user / "swarm" / CONFIG_FILE_NAME,
        Path("/etc/swarm") / CONFIG_FILE_NAME,
    )


def find_config_file(environ: Mapping[str, str] | None = None) -> Path | None:
    return next((p for p in config_search_path(environ) if p.is_file()), None)


def config_as_toml(config: Config, models: Sequence[ModelEntry] = ()) -> str:
    """Every setting in force, as a TOML file that `--config` would accept; with several
    `models`, their [[models]] tables in place of runtime.model."""
    lines: list[str] = []
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        values = getattr(config, section.name)
        for item in dataclasses.fields(values):
            value = getattr(values, item.name)
            if models and (section.name, item.name) == ("runtime", "model"):
                lines.append("# model = (each of [[models]] below runs as a node of its own)")
            elif item.name in _SECRET_FIELDS and value:
                lines.append(f'{item.name} = "<redacted>"')
            elif value is None:
                lines.append(f"# {item.name} = (not set)")
            else:
                lines.append(f"{item.name} = {_toml_value(value)}")
        lines.append("")
    for entry in models:
        lines.append("[[models]]")
        for item in dataclasses.fields(entry):
            lines.append(f"{item.name} = {_toml_value(getattr(entry, item.name))}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


_HEADER = """\
# swarm node configuration, every setting at its default and commented out (written by
# `swarm config --defaults`; tests/test_config.py checks it matches). Without --config a node
# reads the first of ./bootstrap.toml, ~/.config/swarm/bootstrap.toml ($XDG_CONFIG_HOME) and
# /etc/swarm/bootstrap.toml that exists: copy this file there and uncomment what you change.
# SWARM_<SECTION>_<FIELD> environment variables override this file (SWARM_RUNTIME_THREADS=2),
# and flags override both; `swarm config` prints the settings in force. Paths under ~ follow
# $XDG_CACHE_HOME and $XDG_STATE_HOME where those are set. A setting shown as "" is unset.
#
# Several models on this machine: a [[models]] table each, instead of runtime.model (what
# `swarm node --model A --model B` does). Each model runs as a node of its own: model k's on
# node.port + 2k, its fast links on the port after it, its state in state_dir/models/<name>;
# every one answers for every model. Memory for layers is split by the models' bytes unless
# a table gives its own; the name clients call it by is its own unless a table gives one.
#   [[models]]
#   model = "smollm2-135m-instruct"
#   [[models]]
#   model = "~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf"
#   layer_memory_bytes = "2GiB"
#   served_model_name = "qwen"
"""


def defaults_as_toml() -> str:
    """The repository's bootstrap.toml: every setting of `Config()` commented out at its
    default, under the comments swarm/config.py gives it, so the file documents every setting
    and changes nothing by being found."""
    import swarm.config

    comments = _field_comments(inspect.getsource(swarm.config))
    config = Config()
    lines = [_HEADER]
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        cls = type(values)
        hints = get_type_hints(cls)
        lines.append(f"[{section.name}]")
        doc = cls.__doc__ or ""
        if not doc.startswith(f"{cls.__name__}("):  # dataclass's made-up docstring
            lines.extend(f"# {line}".rstrip() for line in inspect.cleandoc(doc).splitlines())
        for item in dataclasses.fields(values):
            above, inline = comments.get((cls.__name__, item.name), ((), ""))
            choices = get_args(hints[item.name]) if get_origin(hints[item.name]) is Literal else ()
            if choices and not inline:
                inline = "one of " + ", ".join(map(str, choices))
            lines.extend(f"# {line}" for line in above)
            setting = f"# {item.name} = {_default_value(getattr(values, item.name))}"
            lines.append(f"{setting}  # {inline}" if inline else setting)
        lines.append("")
    return "\n".join(lines)


def _default_value(value: Any) -> str:
    if value is None:
        return '""'  # an optional setting: "" reads as unset
    if isinstance(value, Path):
        home = str(Path.home())  # the file must read the same on every machine
        text = str(value)
        return json.dumps("~" + text[len(home) :] if text.startswith(home + "/") else text)
    return _toml_value(value)


def _field_comments(source: str) -> dict[tuple[str, str], tuple[tuple[str, ...], str]]:
    """(class, field) -> (the comment lines right above the field, its same-line comment),
    read from a module's source: the unit comments STYLE.md asks of every config field are
    the one place a setting is described."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.removeprefix("#").strip()
    lines = source.splitlines()

    def alone(number: int) -> bool:  # a line holding nothing but a comment
        return number in comments and lines[number - 1].lstrip().startswith("#")

    found: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                start = item.lineno
                above: list[str] = []
                while alone(start - 1 - len(above)):
                    above.insert(0, comments[start - 1 - len(above)])
                end = item.end_lineno or start
                inline = next((comments[n] for n in range(start, end + 1) if n in comments), "")
                found[(node.name, item.target.id)] = (tuple(above), inline)
    return found
