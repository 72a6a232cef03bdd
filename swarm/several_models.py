"""One machine asked for several models (`swarm node --model A --model B`, or `[[models]]` in
bootstrap.toml) runs an ordinary node per model, each a process of its own
(`swarm/supervisor.py`). What each of them gets is decided here, as pure functions: its
ports, its share of the memory for layers (and of the GPU's), its state folder, and whether
the start is refused, in one line, before any of them loads anything.

Ports: a node takes its port and, for its fast links, the one after it; model k's node takes
`port + 2k` and `port + 2k + 1`, so the machine's ports are one run from `port` on and the
node at `port` is the one the user named (every node answers for every model: membership and
`ModelRoutes` send a request for another model on to its node)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from swarm.config import Config, ModelEntry
from swarm.errors import ConfigError
from swarm.types import join_host_port, split_host_port

_FOLDER_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_DIAL = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # a node bound to every address, dialled here


@dataclass(frozen=True)
class ModelSize:
    """A model's decoder layers as its file stores them."""

    layer_bytes: int  # bytes of all its decoder layers' weights
    layers: int  # how many decoder layers it has

    @property
    def one_layer(self) -> int:
        return -(-self.layer_bytes // self.layers)


@dataclass(frozen=True)
class ChildPlan:
    """One model's node: what its config says that the machine's other nodes' do not."""

    name: str  # the name clients call its model by
    model: str  # what runtime.model takes
    port: int  # its node.port
    fast_port: int  # its net.fast_port
    layer_memory_bytes: int  # its runtime.layer_memory_bytes
    gpu_memory_bytes: int  # its runtime.gpu_memory_bytes (0: none, as the machine's)
    served_model_name: str  # its api.served_model_name
    folder: str  # its state folder, under the machine's node.state_dir
    join: tuple[str, ...]  # its node.join: the machine's, then (past the first) the first node
    advertise: str  # its node.advertise: the machine's host, its port moved as its own is

    def config(self, machine: Config) -> Config:
        """`machine`'s config with this model's settings: the config its node runs with."""
        state_dir = machine.node.state_dir.expanduser() / "models" / self.folder
        runtime = replace(
            machine.runtime,
            model=self.model,
            layer_memory_bytes=self.layer_memory_bytes,
            gpu_memory_bytes=self.gpu_memory_bytes,
        )
        return replace(
            machine,
            runtime=runtime,
            node=replace(
                machine.node,
                port=self.port,
                state_dir=state_dir,
                join=self.join,
                advertise=self.advertise,
            ),
            net=replace(machine.net, fast_port=self.fast_port),
            api=replace(machine.api, served_model_name=self.served_model_name),
        )


def child_ports(port: int, count: int) -> tuple[tuple[int, int], ...]:
    """(node port, fast port) of each of `count` models' nodes, from the machine's `port`."""
    if port == 0:
        raise ConfigError(
            "--port 0 (any free port) cannot serve several models: model k's node takes "
            "--port + 2k and the port after it, so name a port"
        )
    last = port + 2 * count - 1
    if last > 65535:
        raise ConfigError(
            f"{count} models take ports {port}..{last}, past 65535: choose a lower --port"
        )
    return tuple((port + 2 * k, port + 2 * k + 1) for k in range(count))


def folder_name(name: str) -> str:
    """A model's state folder: its name, with anything but letters, digits, . _ - as _."""
    return _FOLDER_CHARS.sub("_", name)


def check_distinct(entries: Sequence[ModelEntry], names: Sequence[str]) -> None:
    """ConfigError where two entries name the same model, or two models the same name."""
    models: dict[str, str] = {}
    named: dict[str, str] = {}
    for entry, name in zip(entries, names, strict=True):
        if entry.model in models:
            raise ConfigError(
                f"model {entry.model!r} is given twice: a node serves each model once "
                "(a second copy is another machine's node)"
            )
        for key in {name, folder_name(name)}:
            if key in named:
                raise ConfigError(
                    f"models {named[key]!r} and {entry.model!r} both go by the name {name!r}: "
                    "give one another served_model_name in [[models]]"
                )
            named[key] = entry.model
        models[entry.model] = name


def memory_shares(
    total: int, given: Sequence[int], sizes: Sequence[ModelSize | None]
) -> tuple[int, ...]:
    """Each model's bytes for layers: its own share where `given` has one (> 0), else its
    part of what `total` leaves, in proportion to its layers' bytes (a model whose size is
    unknown, fetched from peers, weighs as the known ones do on average)."""
    known = [s.layer_bytes for s in sizes if s is not None]
    average = sum(known) // len(known) if known else 1
    weights = [average if s is None else s.layer_bytes for s in sizes]
    rest = max(0, total - sum(given))
    unshared = sum(w for w, g in zip(weights, given, strict=True) if not g) or 1
    return tuple(g or rest * w // unshared for w, g in zip(weights, given, strict=True))


def least_memory(total: int, given: Sequence[int], sizes: Sequence[ModelSize | None]) -> int:
    """The least `total` whose shares hold a layer of each model whose size is known."""
    known = [s.layer_bytes for s in sizes if s is not None]
    average = sum(known) // len(known) if known else 1
    weights = [average if s is None else s.layer_bytes for s in sizes]
    unshared = sum(w for w, g in zip(weights, given, strict=True) if not g)
    rest = max(
        (
            -(-unshared * s.one_layer // w)
            for s, w, g in zip(sizes, weights, given, strict=True)
            if s is not None and not g
        ),
        default=0,
    )
    return sum(given) + rest


def plan_children(
    machine: Config,
    entries: Sequence[ModelEntry],
    names: Sequence[str],
    sizes: Sequence[ModelSize | None],
    available: int,
) -> tuple[ChildPlan, ...]:
    """Each model's node, or ConfigError saying in one line why the machine cannot start
    them. `names`: each model's name; `sizes`: each model's layers (None: unknown here);
    `available`: bytes of memory free now (for runtime.layer_memory_bytes 0)."""
    _check_settings(machine)
    check_distinct(entries, names)
    ports = child_ports(machine.node.port, len(entries))
    given = [e.layer_memory_bytes for e in entries]
    total = machine.runtime.ram_for_layers(available)
    shares = memory_shares(total, given, sizes)
    if not machine.runtime.gpu_memory_bytes:  # with a device cap, each node checks its own
        _check_fit(machine, total, given, names, sizes, shares)
    first = join_host_port(_DIAL.get(machine.node.host, machine.node.host), ports[0][0])
    joins = [machine.node.join, *[(*machine.node.join, first)] * (len(entries) - 1)]
    none = [0] * len(entries)
    gpu = memory_shares(machine.runtime.gpu_memory_bytes, none, sizes)
    return tuple(
        ChildPlan(
            name=name,
            model=entry.model,
            port=port,
            fast_port=fast_port,
            layer_memory_bytes=share,
            gpu_memory_bytes=gpu_share,
            served_model_name=entry.served_model_name,
            folder=folder_name(name),
            join=tuple(dict.fromkeys(join)),
            advertise=_moved(machine.node.advertise, port - machine.node.port),
        )
        for entry, name, (port, fast_port), share, gpu_share, join in zip(
            entries, names, ports, shares, gpu, joins, strict=True
        )
    )


def _moved(advertise: str, by: int) -> str:
    """`advertise` (host:port, or "" for none) with its port `by` further on."""
    if not advertise:
        return ""
    host, port = split_host_port(advertise)
    return join_host_port(host, port + by)


def _check_settings(machine: Config) -> None:
    """Settings that name one model's things, refused with several."""
    if machine.net.fast_port:
        raise ConfigError(
            "--fast-port cannot be set with several models: model k's node takes --port + 2k "
            "for its API and the port after it for its fast links"
        )
    if machine.placement.span:
        raise ConfigError("--span names one model's layers: it cannot be set with several models")
    if machine.speculation.draft_model:
        raise ConfigError(
            "--draft-model drafts for one model's vocabulary: it cannot be set with several models"
        )
    if machine.api.served_model_name:
        raise ConfigError(
            "--served-model-name names one model: with several, give each its "
            "served_model_name in [[models]]"
        )
    if machine.runtime.device == "cuda" and not machine.runtime.gpu_memory_bytes:
        raise ConfigError(
            "several models on one GPU need --gpu-memory (the device's bytes for all of "
            "them), which their nodes split as they split the memory for layers"
        )


def _check_fit(
    machine: Config,
    total: int,
    given: Sequence[int],
    names: Sequence[str],
    sizes: Sequence[ModelSize | None],
    shares: Sequence[int],
) -> None:
    """ConfigError naming each model's bytes where a share cannot hold one of its layers."""
    short = [
        name
        for name, size, share in zip(names, sizes, shares, strict=True)
        if size is not None and share < size.one_layer
    ]
    if not short:
        return
    each = ", ".join(
        f"{name}'s {size.layers} layers take {_mb(size.layer_bytes)} (its share {_mb(share)})"
        for name, size, share in zip(names, sizes, shares, strict=True)
        if size is not None
    )
    where = (
        f"--layer-memory-bytes {_mb(total)}"
        if machine.runtime.layer_memory_bytes
        else f"70% of the free memory, {_mb(total)}"
    )
    own = [n for n, g in zip(names, given, strict=True) if g and n in short]
    fix = (
        f"give {' and '.join(own)} more layer_memory_bytes in [[models]]"
        if own
        else f"give --layer-memory-bytes at least {_mb(least_memory(total, given, sizes))}"
    )
    raise ConfigError(
        f"memory for layers ({where}) cannot hold a layer of each model: {each}; {fix}"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
