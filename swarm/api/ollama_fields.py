"""Ollama's /api/chat and /api/generate bodies into a GenerationRequest, the same request the
OpenAI routes make, so both run one generation path.

As on the OpenAI routes, every field and option is honoured or refused with a 400 that names
it. Options that only tune how llama.cpp runs (threads, GPU layers, memory mapping, batch
size) are accepted and change nothing here; options that would change the text in a way
swarm does not do (mirostat, typical_p, a repetition window shorter than the context) are
refused, unless they ask for nothing (mirostat 0, typical_p 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from swarm.api.backend import GenerationRequest
from swarm.api.errors import bad_request
from swarm.api.fields import chat_logprobs, number, stop_strings
from swarm.api.formats import ANY_OBJECT, json_grammar
from swarm.api.ollama_messages import NO_IMAGES, chat_messages
from swarm.api.tools import Tools, parse_tools
from swarm.errors import SamplingError
from swarm.sampling_settings import BOUNDS, SamplingSettings

# Ollama's own defaults where a request sets none (its other defaults are swarm's: min_p 0,
# no penalty, a random seed, no length limit). Ollama's repeat_penalty 1.1 over the last 64
# tokens has no equal here (swarm's penalty counts the whole sequence), so none applies.
DEFAULTS: dict[str, float] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}

# Ollama's option -> (SamplingSettings field, its type); bounds are BOUNDS of the field.
_SAMPLING: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repetition_penalty", float),
    # as Ollama's own OpenAI-compatible routes map OpenAI's: swarm's are OpenAI's, counted
    # over the answer
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
}
_PENALTIES = ("repeat_penalty", "presence_penalty", "frequency_penalty")
_NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# How llama.cpp runs, not what it writes: accepted and ignored. num_keep only says what a
# context shift keeps, and swarm never shifts (a prompt too long for the context is a 400).
RUNTIME_ONLY = frozenset(
    {
        "num_keep",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "numa",
        "num_thread",
        "embedding_only",
        "mirostat_tau",  # these two tune mirostat, which is refused unless off
        "mirostat_eta",
    }
)
# Samplers swarm does not have, accepted only at the value that turns them off.
_OFF_ONLY: dict[str, Any] = {
    "mirostat": 0,
    "typical_p": 1.0,
    "tfs_z": 1.0,
    "penalize_newline": True,  # false exempts newlines from penalties; swarm's counts them
}
_SPECIAL = frozenset({"seed", "num_predict", "stop", "num_ctx", "repeat_last_n"})

_COMMON = frozenset(
    {"model", "format", "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"}
)
_CHAT = _COMMON | {"messages", "tools"}
_GENERATE = _COMMON | {"prompt", "system", "raw", "suffix", "template", "context", "images"}
# Known to Ollama's API, honoured only where empty (or false): the refusal otherwise.
_ONLY_EMPTY: dict[str, str] = {
    "suffix": "suffix (fill-in-the-middle) is not supported by this server",
    "template": "template is not supported: swarm renders prompts with the model's own "
    "chat template (send raw: true with a prompt you formatted yourself)",
    "context": "context is not supported: swarm returns no token context; send the "
    "conversation as messages to /api/chat",
    "images": NO_IMAGES,
}
_IMAGE_GENERATION = frozenset({"width", "height", "steps"})
_UNLOAD = (0, "0", "0s", "0m", "0h")  # keep_alive values that ask Ollama to unload the model


@dataclass(frozen=True)
class OllamaRequest:
    model: str  # as the client named it: Ollama's answers echo it
    # None: nothing to generate (an empty prompt or no messages), which Ollama answers at
    # once with done_reason "load" (or "unload", with keep_alive 0)
    request: GenerationRequest | None
    stream: bool
    tools: Tools | None = None  # where a chat offers tools: answers may be calls
    unload: bool = False


def check_model(body: dict[str, Any], field: str = "model") -> str:
    """The model the body names; which one it is, and whether the swarm serves it, the
    router decided before the body got here (`api/model_routes.py`)."""
    model = body.get(field)
    if not isinstance(model, str) or not model:
        raise bad_request(f"{field} is required: the name of a model (/api/tags lists them)", field)
    return model


def parse_chat(body: dict[str, Any], served: str, context_tokens: int) -> OllamaRequest:
    _refuse_unknown(body, _CHAT)
    model = check_model(body)
    messages = body.get("messages")
    if messages is None:
        messages = []
    if not isinstance(messages, list):
        raise bad_request("messages must be an array of messages", "messages")
    tools = None if not body.get("tools") else parse_tools({"tools": body["tools"]})
    if not messages:
        return _nothing(model, body, context_tokens)
    request = GenerationRequest(
        messages=chat_messages(messages),
        prompt=None,
        sampling=sampling(body, context_tokens),
        tools=None if tools is None else tools.rendered,
    )
    return OllamaRequest(model, request, _stream(body), tools)


def parse_generate(body: dict[str, Any], served: str, context_tokens: int) -> OllamaRequest:
    """A prompt is the user's turn of the chat template, after `system` where given; with
    raw: true it is the model's whole input, as it is."""
    _refuse_unknown(body, _GENERATE)
    model = check_model(body)
    prompt, system = _text(body, "prompt"), _text(body, "system")
    raw = body.get("raw") or False
    if not isinstance(raw, bool):
        raise bad_request("raw must be true or false", "raw")
    if not prompt:
        return _nothing(model, body, context_tokens)
    settings = sampling(body, context_tokens)
    if raw:
        if system:
            raise bad_request(
                "system cannot be used with raw: a raw prompt goes as it is", "system"
            )
        return OllamaRequest(model, GenerationRequest(None, prompt, settings), _stream(body))
    turns = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": prompt})
    return OllamaRequest(model, GenerationRequest(turns, None, settings), _stream(body))


def sampling(body: dict[str, Any], context_tokens: int) -> SamplingSettings:
    """The request's options, format and logprobs as swarm's sampling settings."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise bad_request("options must be an object", "options")
    _refuse_options(options)
    values = {
        field: _option(options, name, kind, DEFAULTS.get(name))
        for name, (field, kind) in _SAMPLING.items()
    }
    if _penalties_off(options, context_tokens):
        values.update({_SAMPLING[name][0]: _NEUTRAL[name] for name in _PENALTIES})
    _num_ctx(options, context_tokens)
    try:
        return SamplingSettings(
            **{k: v for k, v in values.items() if v is not None},
            max_tokens=_num_predict(options),
            seed=_seed(options),
            stop=stop_strings(options.get("stop"), "options.stop"),
            grammar=_format(body.get("format")),
            logprobs=chat_logprobs(body),
        )
    except SamplingError as e:
        raise bad_request(str(e), e.param) from None


def _refuse_unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    for name, value in body.items():
        if name in _IMAGE_GENERATION:
            raise bad_request(f"{name}: image generation is not supported by this server", name)
        if name not in known:
            raise bad_request(f"unknown field {name!r}", name)
        if name in _ONLY_EMPTY and value:
            raise bad_request(_ONLY_EMPTY[name], name)
    think = body.get("think")
    if think not in (None, False):
        raise bad_request(
            "think is not supported: this server streams no separate thinking", "think"
        )
    keep_alive = body.get("keep_alive")
    if keep_alive is not None and (
        isinstance(keep_alive, bool) or not isinstance(keep_alive, (str, int, float))
    ):
        raise bad_request(
            'keep_alive must be a duration ("5m") or a number of seconds', "keep_alive"
        )


def _refuse_options(options: dict[str, Any]) -> None:
    for name, value in options.items():
        label = f"options.{name}"
        if name in _OFF_ONLY:
            if value is not None and value != _OFF_ONLY[name]:
                raise bad_request(
                    f"{label} is not supported by this server (only {json.dumps(_OFF_ONLY[name])}, "
                    "which turns it off)",
                    label,
                )
        elif name not in _SAMPLING and name not in _SPECIAL and name not in RUNTIME_ONLY:
            raise bad_request(f"unknown option {name!r}", label)


def _option(
    options: dict[str, Any], name: str, kind: type, default: Any, low: float | None = None
) -> Any:
    """An option as `kind` within the bounds of its swarm field (or above `low`). An
    integer option may come as a whole float (8192.0), as Ollama takes it."""
    value = options.get(name)
    if kind is int and isinstance(value, float) and value.is_integer():
        options = {**options, name: int(value)}
    bound = BOUNDS.get(_SAMPLING[name][0] if name in _SAMPLING else name)
    high = None
    if bound is not None:
        low, high = bound.low, bound.high
    return number(options, name, kind, default, low, high, label=f"options.{name}")


def _penalties_off(options: dict[str, Any], context_tokens: int) -> bool:
    """repeat_last_n: 0 turns every penalty off (as in llama.cpp); -1 (the whole context),
    or a window as long as the context, is what swarm's penalties count. A shorter window
    is refused where a penalty is on: swarm's cannot forget older tokens."""
    window = _option(options, "repeat_last_n", int, None, low=-1)
    if window == 0:
        return True
    on = any(options.get(name) not in (None, _NEUTRAL[name]) for name in _PENALTIES)
    if window is not None and window != -1 and window < context_tokens and on:
        raise bad_request(
            f"options.repeat_last_n = {window} is not supported: swarm's penalties count "
            "every token of the sequence; send -1 (the whole context) or 0 (no penalty)",
            "options.repeat_last_n",
        )
    return False


def _num_ctx(options: dict[str, Any], context_tokens: int) -> None:
    """Accepted up to the model's context: a session holds what it uses, up to all of it."""
    wanted = _option(options, "num_ctx", int, None)
    if wanted is not None and not 1 <= wanted <= context_tokens:
        raise bad_request(
            f"options.num_ctx = {wanted} is not supported: the model's context is "
            f"{context_tokens} tokens",
            "options.num_ctx",
        )


def _num_predict(options: dict[str, Any]) -> int | None:
    """-1 (Ollama's default) and -2 (fill the context): up to the end of the context."""
    tokens: int | None = _option(options, "num_predict", int, None)
    if tokens in (-1, -2):
        return None
    if tokens is not None and tokens < 1:
        raise bad_request(
            "options.num_predict must be -1 (no limit), -2 (fill the context) or at least 1",
            "options.num_predict",
        )
    return tokens


def _seed(options: dict[str, Any]) -> int | None:
    """-1 is Ollama's (and llama.cpp's) random seed."""
    seed: int | None = _option(options, "seed", int, None)
    return None if seed == -1 else seed


def _format(value: Any) -> str | None:
    """Ollama's format: "json" (any JSON object) or a JSON schema, as a grammar the entry
    enforces while sampling, as OpenAI's response_format is."""
    if value is None or value == "":
        return None
    if value == "json":
        return json_grammar(ANY_OBJECT, "format")
    if isinstance(value, dict):
        return json_grammar(value, "format", "the format's JSON schema")
    raise bad_request('format must be "json" or a JSON schema object', "format")


def _stream(body: dict[str, Any]) -> bool:
    """Ollama streams unless told not to."""
    stream = body.get("stream")
    if stream is None:
        return True
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    return stream


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string", name)
    return value


def _nothing(model: str, body: dict[str, Any], context_tokens: int) -> OllamaRequest:
    """No prompt: Ollama loads (or, with keep_alive 0, unloads) the model and answers done.
    A swarm's model stays loaded either way; the options are still checked."""
    sampling(body, context_tokens)
    keep_alive = body.get("keep_alive")
    return OllamaRequest(model, None, _stream(body), unload=keep_alive in _UNLOAD)
