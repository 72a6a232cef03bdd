"""`swarm node` asked for several models: an ordinary node per model, each a `swarm node`
process of its own started with its whole config in a file, and this process between them
and the user. What each node gets (ports, memory, state folder) and when the start is refused
is decided in `swarm/several_models.py`; here the models are measured, the ports checked, the
nodes started, signals passed on and exits reported.

Why processes and not several members in one: a node is one compute thread, one HTTP server,
one membership; several in one process would share the server and route gossip and links by
receiver. As processes, each model's node is the node every other test and user runs, and
one that fails leaves the others serving."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psutil

from swarm.config import Config, ModelEntry, without_config_variables
from swarm.config_files import config_as_toml
from swarm.errors import ModelNotFoundError
from swarm.net.ports import Listener, bind_port
from swarm.runtime.checkpoint.gguf_file import read_table
from swarm.runtime.checkpoint.source import SourceKind, hub_ref, resolve_model, served_names
from swarm.several_models import ChildPlan, ModelSize, plan_children

log = logging.getLogger(__name__)

_CONFIG_FILE = "node.toml"  # each model's node's whole config, in its state folder
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when this process dies
_FORWARDED = (signal.SIGTERM, signal.SIGINT)  # passed on to every node


@dataclass
class Child:
    plan: ChildPlan
    process: subprocess.Popen[bytes]


def serve_models(
    machine: Config, entries: Sequence[ModelEntry], log_level: str, log_format: str
) -> int:
    """Run a node per model of `entries` until every one has exited; the exit status."""
    names = [served_names(e.served_model_name, e.model)[0] for e in entries]
    sizes = [model_size(e.model, machine) for e in entries]
    available = psutil.virtual_memory().available
    plans = plan_children(machine, entries, names, sizes, available)
    check_ports(machine, plans)  # before any node loads: a taken one fails the start now
    children: dict[int, Child] = {}
    leaving = False

    def forward(sig: int, _frame: FrameType | None) -> None:
        nonlocal leaving
        leaving = True  # the first asks each node to leave, a second stops them at once
        for child in children.values():
            if child.process.returncode is None:
                child.process.send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        for plan in plans:
            # held while a node starts, so a signal finds it among the children
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
            try:
                if not leaving:
                    process = _start(plan, machine, log_level, log_format)
                    children[process.pid] = Child(plan, process)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        said = ", ".join(f"{p.name} on {machine.node.host}:{p.port}" for p in plans)
        print(
            f"swarm node: {len(plans)} models, a node each: {said}; each answers for every model",
            file=sys.stderr,
            flush=True,
        )
        return _supervise(children)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def model_size(ref: str, machine: Config) -> ModelSize | None:
    """The layers of the model `ref` names, read from its file's table (no weights are read);
    None for a model this machine does not hold, whose node fetches it (from the hub, or by
    its id or name from peers)."""
    try:
        source = resolve_model(ref)
    except ModelNotFoundError:
        from_peers = (machine.node.join or machine.node.discover) and not Path(ref).suffix
        if hub_ref(ref) is not None or (from_peers and "/" not in ref):
            return None
        raise
    if source.kind is SourceKind.GGUF:
        tensors = read_table(source.path).tensors.values()
        blocks = [t for t in tensors if t.name.startswith("blk.")]
        count = len({t.name.split(".")[1] for t in blocks})
        return ModelSize(sum(t.nbytes for t in blocks), count) if count else None
    try:
        config = json.loads((source.path / "config.json").read_text())
        layers = int(config.get("num_hidden_layers") or config["text_config"]["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    weights = sum(f.stat().st_size for f in source.files()[1:])
    return ModelSize(weights, layers) if layers > 0 else None


def check_ports(machine: Config, plans: Sequence[ChildPlan]) -> None:
    """Bind every node's ports, then let them go: BindError naming the first that is taken."""
    host = machine.node.host
    with contextlib.ExitStack() as held:
        for plan in plans:
            held.enter_context(
                bind_port(host, plan.port, Listener(f"{plan.name}'s port", "--port"))
            )
            if machine.net.fast_links:
                fast = Listener(f"{plan.name}'s fast port", "--port")
                held.enter_context(bind_port(host, plan.fast_port, fast))


def _start(
    plan: ChildPlan, machine: Config, log_level: str, log_format: str
) -> subprocess.Popen[bytes]:
    config = plan.config(machine)
    folder = config.node.state_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / _CONFIG_FILE
    path.write_text(config_as_toml(config))  # the token is left out: it goes in the environment
    env = without_config_variables(os.environ)
    if machine.api.token:
        env["SWARM_API_TOKEN"] = machine.api.token
    argv = [sys.executable, "-m", "swarm", "--log-level", log_level, "--log-format", log_format]
    return subprocess.Popen(
        [*argv, "node", "--config", str(path)],
        env=env,
        stdin=subprocess.DEVNULL,
        process_group=0,  # a terminal's Ctrl-C reaches this process, which passes it on once
        preexec_fn=_in_the_child,
    )


def _in_the_child() -> None:
    """In the child, before it runs: the signals held while it started reach it again, and
    (on Linux) SIGTERM, a graceful leave, comes when this process dies, so a supervisor that
    is killed leaves no node behind."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _supervise(children: dict[int, Child]) -> int:
    """Wait for every child, saying in one line how each ended; 0 if each left cleanly, else
    the first other exit status."""
    status = 0
    while any(c.process.returncode is None for c in children.values()):
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        child = children.get(pid)
        if child is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        child.process.returncode = code
        alive = [c.plan.name for c in children.values() if c.process.returncode is None]
        ended = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        still = f"; still serving: {', '.join(alive)}" if alive and code else ""
        level = logging.INFO if code == 0 else logging.WARNING
        log.log(
            level, "model %s's node (port %d) %s%s", child.plan.name, child.plan.port, ended, still
        )
        status = status or (code if code > 0 else int(code < 0))
    return status
