"""The `swarm` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from swarm.config import Config, load_config
from swarm.errors import SwarmError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = _config_from(args)
        result: int = _run(args.handler(args, config))
        return result
    except SwarmError as e:
        print(f"swarm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm", description="Distributed LLM inference for home labs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="generate text in this process (whole model or a split)"
    )
    _add_runtime_flags(gen)
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--split", help="run through several shards, e.g. 0:10,10:20,20:30")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.set_defaults(handler=_generate)
    return parser


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="a bootstrap.toml")
    p.add_argument("--model", help="smollm2-135m-instruct, a .gguf file, or a Hugging Face folder")
    p.add_argument("--cache-dir", help="where converted models are kept")
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument("--dtype", help="float32, bfloat16 or float16")
    p.add_argument("--threads", help="torch threads (0 = all cores)")


def _config_from(args: argparse.Namespace) -> Config:
    runtime = {
        key: value
        for key, value in (
            ("model", args.model),
            ("cache_dir", args.cache_dir),
            ("device", args.device),
            ("dtype", args.dtype),
            ("threads", args.threads),
        )
        if value is not None
    }
    return load_config(args.config, overrides={"runtime": runtime})


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _generate(args: argparse.Namespace, config: Config) -> int:
    from swarm.inference.generation import Chunk, generate
    from swarm.inference.local import load_local
    from swarm.runtime.sampling import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    local = await load_local(config.runtime, args.split)
    try:
        if args.raw:
            prompt = local.entry.encode_text(args.prompt)
        else:
            prompt = local.entry.encode_chat([{"role": "user", "content": args.prompt}])
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        async for event in generate(local.entry, local.pipeline, local.compute, prompt, params):
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
            f"({finish.reason}); first token {1000 * ((first or end) - start):.0f} ms, "
            f"{decode_rate:.1f} tokens/s; spans {spans}]",
            file=sys.stderr,
        )
        return 0
    finally:
        local.compute.close()
