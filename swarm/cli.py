"""The `swarm` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from swarm import __version__
from swarm.config import Config, ModelEntry, invite_from_environment, load_config, load_models
from swarm.config_files import config_as_toml, defaults_as_toml, find_config_file
from swarm.errors import ConfigError, NoChatTemplateError, SwarmError
from swarm.exits import BROKEN_PIPE, exit_status, quiet_stdout, quiet_triton_teardown
from swarm.logs import LOG_LEVELS, configure_logging
from swarm.sampling_settings import SamplingSettings

log = logging.getLogger(__name__)
Preset = Literal["local", "lan"]
_USE_RAW = "this model has no chat template (a base model): use --raw to send the prompt as is"

if TYPE_CHECKING:
    from swarm.invite import KeptFiles
    from swarm.schema import NodeStatus, RequestTrace


def command() -> None:
    """The `swarm` command: `main`, then the process ends."""
    status = main()
    quiet_triton_teardown()
    raise SystemExit(status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging("debug" if args.verbose else args.log_level, args.log_format)
    try:
        config = _config_from(args)
        outcome = args.handler(args, config)  # `swarm chat` runs its own loop per answer
        result: int = _run(outcome) if asyncio.iscoroutine(outcome) else outcome
        sys.stdout.flush()  # here, where a reader that went away is caught
        return result
    except SwarmError as e:
        print(f"swarm: error: {e}", file=sys.stderr)
        return exit_status(e)
    except BrokenPipeError:
        quiet_stdout()
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm", description="Distributed LLM inference for home labs."
    )
    parser.add_argument("--version", action="version", version=f"swarm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object a line"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="generate text: in this process (whole or split), or ask a swarm (--node)"
    )
    _add_runtime_flags(gen)
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--split", help="run through several shards, e.g. 0:10,10:20,20:30")
    gen.add_argument("--node", help="ask the running swarm at host:port instead")
    _add_draft_flag(gen)
    _add_token_flag(gen)
    _add_sampling_flags(gen, max_tokens=128)
    gen.set_defaults(handler=_generate)

    talk = commands.add_parser(
        "chat", help="a conversation in the terminal: in this process, or with a swarm (--node)"
    )
    _add_runtime_flags(talk)
    talk.add_argument("--node", help="talk to the running swarm at host:port instead")
    _add_token_flag(talk)
    talk.add_argument("--system", default="", help="the system prompt to start with")
    _add_sampling_flags(talk, max_tokens=512)
    talk.set_defaults(handler=_chat)

    node = commands.add_parser("node", help="run a swarm node")
    _add_runtime_flags(node)
    _add_node_flags(node)
    node.add_argument(
        "--invite",
        help="join with the line `swarm invite` printed (or set SWARM_INVITE): keeps its "
        "secret and token in files only their owner may open (the state folder's swarm.key "
        "and api.token, unless --secret-file and --api-token-file name others)",
    )
    node.set_defaults(handler=_node)

    invite = commands.add_parser(
        "invite",
        help="print one line that brings another machine into this node's swarm "
        "(swarm node --invite LINE there)",
    )
    _add_node_and_config(invite, "host:port of the node")
    invite.add_argument("--secret-file", help="the swarm secret the node runs with")
    invite.add_argument("--expires", help="the line stops working after this long: 30m, 1h, 7d")
    _add_token_flag(invite)
    invite.set_defaults(handler=_invite)

    status = commands.add_parser("status", help="print a running swarm's member table")
    status.add_argument("--node", default="127.0.0.1:7420", help="host:port of any node")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    _add_token_flag(status)
    status.set_defaults(handler=_status)

    doctor = commands.add_parser(
        "doctor",
        help="check a running swarm from this machine: who reaches whom on which port, "
        "refused frames and why, clocks, addresses, layers nobody serves; one line each",
    )
    _add_node_and_config(doctor, "host:port of any node")
    doctor.add_argument(
        "--secret-file",
        help="the swarm secret: each member is also sent a frame sealed with it (changing "
        "nothing), which says whether it takes this key and this machine's clock",
    )
    doctor.add_argument("--json", action="store_true", help="the verdicts as JSON")
    _add_token_flag(doctor)
    doctor.set_defaults(handler=_doctor)

    show = commands.add_parser(
        "config", help="print the settings in force (file, environment, flags), secrets hidden"
    )
    _add_runtime_flags(show)
    _add_node_flags(show)
    show.add_argument(
        "--defaults",
        action="store_true",
        help="print instead every setting commented out at its default (the repository's "
        "bootstrap.toml)",
    )
    show.set_defaults(handler=_show_config)

    keygen = commands.add_parser("keygen", help="write a new 32-byte swarm secret")
    keygen.add_argument("path", type=Path, help="file to write (mode 0600); copy it to every node")
    keygen.add_argument("--force", action="store_true", help="overwrite an existing file")
    keygen.set_defaults(handler=_keygen)

    pull = commands.add_parser(
        "pull", help="store every part of a model in the cache, so nodes start without a network"
    )
    pull.add_argument("model", help="what --model takes (a name, a .gguf, a folder, owner/name)")
    _add_cache_flags(pull)
    pull.set_defaults(handler=_pull)

    models = commands.add_parser("models", help="list the models the cache holds, with sizes")
    _add_cache_flags(models)
    models.set_defaults(handler=_models)

    demo = commands.add_parser("demo", help="start 3 nodes on loopback, ask a question, stop them")
    _add_runtime_flags(demo)
    demo.add_argument("--prompt", default=DEMO_PROMPT)
    demo.add_argument("--max-tokens", type=int, default=96)
    demo.set_defaults(handler=_demo)
    return parser


DEMO_PROMPT = "In three sentences, why do home labs run their own language models?"


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        help="a bootstrap.toml (default: ./bootstrap.toml, ~/.config/swarm/bootstrap.toml, "
        "/etc/swarm/bootstrap.toml, the first that exists)",
    )
    p.add_argument(
        "--model",
        action="append",  # given twice, refused by name (`_config_from`)
        help="smollm2-135m-instruct, a .gguf file, a Hugging Face folder, a Hugging Face "
        "repository (owner/name, owner/name:file.gguf, @revision after the name: a node "
        "downloads only what it serves, from peers that hold it, else from the hub at "
        "HF_ENDPOINT), or (with --join and no file here) the id or name `swarm status` shows: "
        "the layers come from the peers",
    )
    p.add_argument("--cache-dir", help="where converted models are kept")
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument(
        "--dtype",
        help="packed (default: a GGUF's own quantized blocks), float32, bfloat16, "
        "float16 (cuda) or int8 (8-bit weights)",
    )
    p.add_argument("--threads", help="torch threads (0 = all cores)")
    p.add_argument(
        "--gpu-memory",
        dest="gpu_memory_bytes",
        help="device memory the node's layers may take, e.g. 20GiB (default: the device's "
        "free memory less 1 GiB); the span's layers past it run on the CPU",
    )
    p.add_argument(
        "--gpu-only",
        action="store_true",
        default=None,
        help="refuse to start rather than run layers past --gpu-memory on the CPU",
    )


def _add_sampling_flags(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="a bootstrap.toml (default: the usual search)")
    p.add_argument("--cache-dir", help="the cache nodes use (runtime.cache_dir)")


def _add_node_and_config(p: argparse.ArgumentParser, node_help: str) -> None:
    p.add_argument("--node", default="127.0.0.1:7420", help=node_help)
    p.add_argument("--config", type=Path, help="a bootstrap.toml (default: the usual search)")


def _add_token_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-token-file", help="file holding the API token (or set SWARM_API_TOKEN)")


def _add_draft_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--draft-model",
        help="a small model with the same vocabulary (what --model takes) that drafts tokens "
        "for the model to verify, where the text has no repeat to draft from",
    )


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    _add_token_flag(p)
    _add_draft_flag(p)
    p.add_argument(
        "--served-model-name",
        help="the model id clients send (default: the model's own name, never its path)",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", help="port to bind (default 7420; 0 = any)")
    p.add_argument(
        "--fast-port",
        help="port the fast links between nodes take (default: 7421 beside the default port "
        "7420, else one the system picks; the start line names it); open it in the firewall",
    )
    p.add_argument(
        "--join",
        action="append",
        help="bootstrap address host:port (repeatable); without one, a node joins the members "
        "of its swarm it finds on the LAN",
    )
    p.add_argument(
        "--no-discover",
        action="store_true",
        help="neither announce this node on the LAN (mDNS) nor look for its swarm there",
    )
    p.add_argument(
        "--advertise",
        help="host:port peers dial to reach this node (default: the bound address, or, bound "
        "to 0.0.0.0 or ::, the address of the route to the bootstrap peer)",
    )
    p.add_argument("--state-dir", help="where the node id is kept")
    p.add_argument("--secret-file", help="32-byte swarm secret (see swarm keygen)")
    p.add_argument("--layer-memory-bytes", help="memory for decoder layers (0 = automatic)")
    p.add_argument("--span", help="serve exactly these layers, e.g. 0:15 (default: automatic)")
    p.add_argument(
        "--prefill-batch-tokens",
        help="tokens of several sessions' prefill chunks run as one call (0 = one at a time)",
    )
    p.add_argument(
        "--transfer-rate-bytes",
        help="bytes per second of weights this node sends each peer (0 = no limit)",
    )
    p.add_argument("--preset", choices=("lan", "local"), default="lan", help="timing preset")


_RUNTIME_FLAGS = (
    "model",
    "cache_dir",
    "device",
    "dtype",
    "threads",
    "gpu_memory_bytes",
    "gpu_only",
    "layer_memory_bytes",
    "prefill_batch_tokens",
)
_NODE_FLAGS = ("host", "port", "advertise", "state_dir", "secret_file")


def _config_from(args: argparse.Namespace) -> Config:
    flags = vars(args)
    path = flags.get("config") or find_config_file()
    models = flags.get("model")
    args.models = ()
    if isinstance(models, list):  # `swarm pull`'s model is a plain argument
        if len(models) > 1 and args.command not in ("node", "config"):
            raise ConfigError(
                f"--model given {len(models)} times ({', '.join(models)}): only `swarm node` "
                "serves several models"
            )
        flags["model"] = models[0] if len(models) == 1 else None
        args.models = tuple(ModelEntry(m) for m in models) if len(models) > 1 else ()
    elif args.command in ("node", "config"):
        args.models = _models_in_file(path, flags)
    runtime = {k: flags[k] for k in _RUNTIME_FLAGS if flags.get(k) is not None}
    node: dict[str, Any] = {k: flags[k] for k in _NODE_FLAGS if flags.get(k) is not None}
    if flags.get("join"):
        node["join"] = tuple(flags["join"])
    if flags.get("no_discover"):
        node["discover"] = False
    api = {"token_file": flags["api_token_file"]} if flags.get("api_token_file") else {}
    if flags.get("served_model_name"):
        api["served_model_name"] = flags["served_model_name"]
    placement = {"span": flags["span"]} if flags.get("span") else {}
    speculation = {"draft_model": flags["draft_model"]} if flags.get("draft_model") else {}
    net = {"fast_port": flags["fast_port"]} if flags.get("fast_port") is not None else {}
    transfer = {}
    if flags.get("transfer_rate_bytes") is not None:
        transfer["rate_bytes_per_s"] = flags["transfer_rate_bytes"]
    if path is not None and flags.get("config") is None:
        log.debug("config file %s", path)
    args.config_file = path
    overrides = {
        "runtime": runtime,
        "node": node,
        "placement": placement,
        "api": api,
        "transfer": transfer,
        "speculation": speculation,
        "net": net,
    }
    preset: Preset = flags.get("preset") or "lan"
    line = flags.get("invite") or (invite_from_environment() if args.command == "node" else None)
    if line:
        _with_invite(line, path, overrides, preset)
    elif args.command == "node":
        _with_kept_invite(path, overrides, preset)
    return load_config(path, overrides=overrides, preset=preset)


def _models_in_file(path: Path | None, flags: dict[str, Any]) -> tuple[ModelEntry, ...]:
    """The config file's [[models]] for a node given no --model: several, or () where it
    has one, which then sets the model, its memory and its name as their flags would."""
    entries = load_models(path)
    if len(entries) != 1:
        return entries
    only = entries[0]
    flags["model"] = only.model
    if only.layer_memory_bytes and flags.get("layer_memory_bytes") is None:
        flags["layer_memory_bytes"] = only.layer_memory_bytes
    if only.served_model_name and not flags.get("served_model_name"):
        flags["served_model_name"] = only.served_model_name
    return ()


def _with_invite(
    line: str, path: Path | None, overrides: dict[str, dict[str, Any]], preset: Preset
) -> None:
    """Check the invite line, keep its secret and token in files, and join through its
    addresses (before any --join): into `overrides`."""
    from swarm.invite import decode_invite, keep_invite

    invite = decode_invite(line, time.time())
    kept = keep_invite(invite, _where_files_go(path, overrides, preset))
    node = overrides["node"]
    node["join"] = tuple(dict.fromkeys((*invite.join, *node.get("join", ()))))
    said = _use_kept(kept, overrides)
    log.info("invited: kept %s (mode 0600); a restart needs only those files", said)


def _with_kept_invite(
    path: Path | None, overrides: dict[str, dict[str, Any]], preset: Preset
) -> None:
    """A node invited before, started with no line and no secret file named: it runs with
    what the invite kept in its state folder."""
    from swarm.invite import kept_by_an_invite

    kept = kept_by_an_invite(_where_files_go(path, overrides, preset))
    if kept is not None:
        log.info("using %s, kept by an invite", _use_kept(kept, overrides))


def _where_files_go(
    path: Path | None, overrides: dict[str, dict[str, Any]], preset: Preset
) -> Config:
    # the config read on loopback, since a wider bind's token check needs the token
    where = {**overrides, "node": {**overrides["node"], "host": "127.0.0.1"}}
    return load_config(path, overrides=where, preset=preset)


def _use_kept(kept: KeptFiles, overrides: dict[str, dict[str, Any]]) -> str:
    """Point the node's secret and token at `kept`; what it now uses, in words."""
    overrides["node"]["secret_file"] = kept.secret_file
    said = f"the swarm secret in {kept.secret_file}"
    if kept.token_file is not None:
        overrides["api"]["token_file"] = kept.token_file
        said += f" and the API token in {kept.token_file}"
    return said


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _generate(args: argparse.Namespace, config: Config) -> int:
    from swarm.inference.entry_side import open_draft_model
    from swarm.inference.generation import Chunk, generate
    from swarm.inference.head import EntryHead
    from swarm.inference.local import load_local

    params = _sampling(args)  # checked here, by the same bounds a swarm's API applies
    if args.node:
        return await _ask_swarm(args, config, params)
    local = await load_local(config.runtime, args.split)
    try:
        if not args.raw and not local.entry.has_chat_template:
            raise NoChatTemplateError(_USE_RAW)
        if args.raw:
            prompt = local.entry.encode_text(args.prompt)
        else:
            prompt = local.entry.encode_chat([{"role": "user", "content": args.prompt}])
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        draft = await open_draft_model(config, local.compute, local.entry)
        head = EntryHead(local.entry, local.compute, 1, config.speculation, draft)
        events = generate(local.entry, local.pipeline, local.compute, prompt, params, None, head)
        async for event in events:
            if isinstance(event, Chunk):
                if first is None:
                    first = time.perf_counter()
                tokens += event.token_id is not None
                sys.stdout.write(event.text)
                sys.stdout.flush()
            else:
                finish = event
        end = time.perf_counter()
        sys.stdout.write("\n")
        decode_rate = (
            (tokens - 1) / (end - first)
            if first is not None and tokens > 1 and end > first
            else 0.0
        )
        spans = ",".join(str(s.span) for s in local.pipeline.shards)
        print(
            f"[{finish.prompt_tokens} prompt tokens, {finish.completion_tokens} generated "
            f"({finish.finish_reason}); first token {1000 * ((first or end) - start):.0f} ms, "
            f"{decode_rate:.1f} tokens/s; spans {spans}]",
            file=sys.stderr,
        )
        return 0
    finally:
        local.compute.close()


def _sampling(args: argparse.Namespace) -> SamplingSettings:
    return SamplingSettings(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )


async def _ask_swarm(args: argparse.Namespace, config: Config, params: SamplingSettings) -> int:
    from swarm.client import SwarmClient, sampling_fields

    prompt = (
        {"prompt": args.prompt}
        if args.raw
        else {"messages": [{"role": "user", "content": args.prompt}]}
    )
    body = {**prompt, **sampling_fields(params)}
    client = SwarmClient(args.node, token=config.api.resolve_token())
    try:
        trace = await _stream_answer(client.complete(body) if args.raw else client.chat(body))
    except NoChatTemplateError:
        raise NoChatTemplateError(_USE_RAW) from None
    _print_trace(trace)
    return 0


async def _stream_answer(chunks: AsyncIterator[dict[str, Any]]) -> RequestTrace | None:
    """Print a streamed answer (chat deltas or completion text); return its trace."""
    from swarm.schema import RequestTrace, from_json

    trace = None
    try:
        async for chunk in chunks:
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {}).get("content", "") or choice.get("text", "")
                sys.stdout.write(delta)
                sys.stdout.flush()
            if "swarm" in chunk:
                trace = from_json(RequestTrace, chunk["swarm"])
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return trace


def _print_trace(trace: RequestTrace | None) -> None:
    if trace is None:
        return
    route = " -> ".join(f"{h.node}[{h.layers[0]}:{h.layers[1]}]" for h in trace.route)
    print(f"[route {route}]", file=sys.stderr)
    for t in trace.hop_timings_ms:
        print(
            f"[hop {t.node}: queue {t.queue:.2f} ms, compute {t.compute:.2f} ms, "
            f"wire {t.wire:.2f} ms (last step)]",
            file=sys.stderr,
        )


def _node(args: argparse.Namespace, config: Config) -> int | Coroutine[Any, Any, int]:
    if args.models:
        from swarm.supervisor import serve_models

        level = "debug" if args.verbose else args.log_level
        return serve_models(config, args.models, level, args.log_format)
    return _one_node(config)


async def _one_node(config: Config) -> int:
    import signal

    from swarm.net.ports import bind_ports

    ports = bind_ports(config.node, config.net)  # before importing torch: a taken port fails now
    from swarm.node import Node

    node = await Node.create(config, ports)
    fast = "no fast links" if node.fast_port is None else f"fast links on port {node.fast_port}"
    print(
        f"swarm node {node.node_id} listening on {node.address}, {fast}",
        file=sys.stderr,
        flush=True,
    )
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def on_signal() -> None:  # the first asks to leave gracefully, a second stops at once
        if node.leave_requested.is_set():
            task.cancel()
        node.leave_requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    with contextlib.suppress(asyncio.CancelledError):
        await node.run()
    return 0


async def _status(args: argparse.Namespace, config: Config) -> int:
    import json

    from swarm.client import SwarmClient
    from swarm.schema import to_json

    status = await SwarmClient(args.node, token=config.api.resolve_token()).status()
    if args.json:
        print(json.dumps(to_json(status), indent=1))
        return 0
    print_status(status)
    return 0


def print_status(status: NodeStatus) -> None:
    """Each model and its coverage, then the member table, with what limits the swarm and
    what cannot be reached above it."""
    from swarm.schema import ServedModel, to_json

    coverage = status.coverage
    own = ServedModel(status.model.name, status.model.id, status.model.layers, coverage, here=True)
    for model in status.models or (own,):  # a node older than several models lists none
        c = model.coverage
        covered = "complete" if c.complete else f"MISSING {to_json(c.missing)}"
        here = ", served here" if model.here and len(status.models) > 1 else ""
        print(
            f"model {model.name} ({model.layers} layers, id {model.model_id[:16]}{here}); {covered}"
        )
    transfer = status.transfer
    if transfer.active:
        print(
            f"fetching weights: {transfer.current} from {', '.join(transfer.sources)}, "
            f"{transfer.bytes_done}/{transfer.bytes_total} bytes, "
            f"{transfer.bytes_per_s / 1e6:.1f} MB/s"
        )
    if transfer.bad_peers:
        print(f"WARNING: peers that sent corrupt weights: {', '.join(transfer.bad_peers)}")
    if coverage.limiting_layers is not None and coverage.limited_by:
        a, b = coverage.limiting_layers
        print(
            f"throughput limited by {', '.join(coverage.limited_by)} (layers {a}:{b}, "
            f"{coverage.bottleneck_tokens_per_s:.1f} tokens/s)"
        )
    if not status.node.reachable_by_peers:
        print(f"WARNING: peers cannot reach this node at {status.node.address} (--advertise?)")
    names = [m.model or m.model_id[:16] for m in status.members]
    wide = max(map(len, ["model", *names])) + 2  # a model's name is as long as its file's
    header = (("id", 14), ("address", 22), ("model", wide), ("state", 9), ("span", 9))
    print("".join(f"{name:{width}}" for name, width in header), end="")
    print(f"{'ms/layer':>9}{'max layers':>11}{'sessions':>9}{'temp':>6}{'skew ms':>9}  reachable")
    for m, name in zip(status.members, names, strict=True):
        span = "-" if m.span is None else f"{m.span[0]}:{m.span[1]}"
        temp = "-" if m.gpu_temperature_c is None else f"{m.gpu_temperature_c:.0f}"
        temp += "!" if m.gpu_throttling else ""  # named in full below the table
        reach = "(this node)" if m.reachable is None else ("yes" if m.reachable else "NO")
        skew = status.clock_skew_ms.get(m.id)  # this node's clock minus the member's
        shown = "-" if skew is None else f"{skew:+.0f}"
        print(
            f"{m.id:14}{m.address:22}{name:{wide}}{m.state:9}{span:9}"
            f"{m.ms_per_layer_decode:9.3f}"
            f"{m.max_layers:11d}{m.active_sessions:9d}{temp:>6}{shown:>9}  {reach}"
        )
    for m in status.members:
        if m.gpu_throttling:
            print(f"WARNING: {m.id}'s GPU runs slowed: {m.gpu_throttling}")
    if status.refusals:
        refused = ", ".join(f"{reason} {n}" for reason, n in status.refusals.items())
        print(f"\nrefused since start: {refused}")


async def _invite(args: argparse.Namespace, config: Config) -> int:
    from swarm.client import SwarmClient
    from swarm.invite import Invite, encode_invite, join_addresses, parse_duration
    from swarm.net.addresses import is_loopback
    from swarm.types import split_host_port
    from swarm.wire import load_secret

    expires = None if args.expires is None else int(time.time()) + parse_duration(args.expires)
    secret = load_secret(config.node.secret_file)
    if secret is None:
        raise ConfigError(
            "the line carries the swarm secret: give the node's with --secret-file "
            "(node.secret_file)"
        )
    token = config.api.resolve_token()
    status = await SwarmClient(args.node, token=token).status()
    members = ((m.address, m.state) for m in status.members)
    join = join_addresses(status.node.address, members)
    if is_loopback(split_host_port(join[0])[0]):
        print(
            f"note: the node advertises {join[0]}, so only this machine can use the line: "
            "start it with --host 0.0.0.0 for others",
            file=sys.stderr,
        )
    print(encode_invite(Invite(secret, token, join, expires)))
    return 0


async def _doctor(args: argparse.Namespace, config: Config) -> int:
    """Exit 0 when every check is ok (or a warning), 1 when any FAIL."""
    from swarm.doctor import as_json, as_lines, diagnose, failed, gather
    from swarm.wire import load_secret

    secret = load_secret(config.node.secret_file) if config.node.secret_file else None
    verdicts = diagnose(await gather(args.node, config.api.resolve_token(), secret))
    print(as_json(verdicts) if args.json else "\n".join(as_lines(verdicts)))
    return 1 if failed(verdicts) else 0


async def _show_config(args: argparse.Namespace, config: Config) -> int:
    if args.defaults:
        print(defaults_as_toml(), end="")
        return 0
    source = args.config_file or "none found (defaults, environment and flags)"
    print(f"# swarm {__version__}; config file: {source}")
    print(config_as_toml(config, args.models), end="")
    return 0


async def _keygen(args: argparse.Namespace, config: Config) -> int:
    from swarm.wire import generate_secret_file

    path = generate_secret_file(args.path, overwrite=args.force)
    print(f"wrote a new swarm secret to {path}; copy it to every node (node.secret_file)")
    return 0


def _chat(args: argparse.Namespace, config: Config) -> int:
    from swarm import chat_terminal

    settings = _sampling(args)
    conversation = chat_terminal.Conversation(system=args.system)
    with contextlib.ExitStack() as closing:
        if args.node:
            from swarm.client import SwarmClient

            client = SwarmClient(args.node, token=config.api.resolve_token())
            start = chat_terminal.remote(client, settings)
        else:
            start = chat_terminal.local(config.runtime, settings, closing)
        return chat_terminal.chat(start, conversation)


async def _pull(args: argparse.Namespace, config: Config) -> int:
    from swarm.pull import check_pulled, progress_bar, pull

    cache, timeout_s = config.runtime.cache_dir, config.transfer.request_timeout_s
    model = await asyncio.to_thread(pull, args.model, cache, timeout_s, progress_bar)
    check_pulled(model)
    print(
        f"{args.model}: all {model.parts_total} parts in {model.folder} "
        f"({model.bytes_held / 1e6:.1f} MB; model id {model.model_id[:16]})"
    )
    return 0


async def _models(args: argparse.Namespace, config: Config) -> int:
    from swarm.pull import cached_models, hub_download_bytes, models_table

    cache = config.runtime.cache_dir
    table = models_table(cached_models(cache), hub_download_bytes(cache), cache)
    print("\n".join(table))
    return 0


async def _demo(args: argparse.Namespace, config: Config) -> int:
    from swarm.demo import run_demo

    return await run_demo(
        config.runtime, args.prompt, args.max_tokens, _stream_answer, _print_trace
    )
