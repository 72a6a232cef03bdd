"""Real `swarm node` processes that skip the imports: each is forked from one server process
that imported swarm, torch and transformers once, then runs `swarm.cli.main` as `python -m
swarm node` does, with its own sockets, state, logs and signals. On a 2-core machine a node's
imports take seconds of CPU, most of a tiny model's start; the family tests start dozens.

`ForkedNode` answers the `Popen` calls tests make (`swarm.demo.NodeProcess`). `harness.cluster`
starts its nodes this way; tests that need a node's own environment or its memory as a fresh
interpreter's start them with `swarm.demo.start_node` instead."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from swarm.config import RuntimeConfig

# what a node imports before and while it loads a family's model
PRELOAD = [
    "harness.forked_nodes",  # the children's entry point
    "swarm.cli",
    "swarm.node",
    "swarm.runtime.checkpoint.convert",
    "safetensors.torch",
    "gguf",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.modeling_gguf_pytorch_utils",
    *(
        f"transformers.models.{name}.modeling_{name}"
        for name in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
    ),
]

_context: Any = None


def _server() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _node_main(argv: list[str], log: str) -> None:
    """The child: the node's output goes where `swarm.demo.start_node` sends it."""
    from swarm import cli

    null = os.open(os.devnull, os.O_WRONLY)
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 1)
    os.dup2(err, 2)
    raise SystemExit(cli.main(argv))


class ForkedNode:
    def __init__(self, argv: list[str], log: Path) -> None:
        self._process = _server().Process(target=_node_main, args=(argv, str(log)))
        self._process.start()
        self.pid: int = self._process.pid

    def poll(self) -> int | None:
        code: int | None = self._process.exitcode
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"node {self.pid}", timeout or 0.0)
        return int(code)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def node_argv(
    port: int, join: str | None, state_dir: Path, runtime: RuntimeConfig, extra: list[str]
) -> list[str]:
    """What `swarm.demo.start_node` passes to `python -m swarm`: `extra` may name the model
    itself (a second --model would start a node per model)."""
    argv = ["node", "--preset", "local", "--port", str(port), "--state-dir", str(state_dir)]
    argv += [] if "--model" in extra else ["--model", runtime.model]
    argv += ["--cache-dir", str(runtime.cache_dir), "--dtype", runtime.dtype, *extra]
    return argv + (["--join", join] if join else [])
