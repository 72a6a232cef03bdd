"""The floor of a split with real layers: what the embedded model's layers cost when N plain
processes on this machine run them in turn, with no node, event loop or swarm frame between
them; against one process running the same calls on the whole model.

A ring of N processes, each holding its share of the layers as a node holds its span
(swarm's runtime: `Shard.load`, one torch thread). The first also holds the entry's pieces.
Per token it embeds the last token and runs its layers; every member sends the hidden state
on to the next as raw bytes over a blocking TCP socket (the last back to the first). There
the head picks the greedy token. The one process makes the same calls in turn
(`Shard.decode_rows` and the head). It runs in this bench's own process, alternated with
the ring's runs, and both decode greedily from one prompt. The tokens are checked equal.

Per ring it prints:
* tokens/s and the ratio to one process (the median of the alternated pairs);
* the overhead per hop: (ring ms per token - one process's) / N, a hop being a frame sent;
* the layers' own time per token, every member's decode calls summed, beside one process's,
  and their excess per hop. This is what running the layers in more processes costs on
  these cores: each member's caches go cold while the others compute, and here the members
  share two cores. No hand-off is in it;
* the rest per hop: the overhead less that excess, i.e. a socket hand-off with real layers
  around it.

`bench.swarm`'s overhead per hop is judged against this ring's.

    python -m bench.layer_ring [--tokens 48] [--repeats 3] [--members 2,3] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import socket
import statistics
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from bench.hop_floor import join_ring, recv_exact
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, SessionId

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
# a frame's header: session number, position, rows, and the ms the members' layers took so far
_HEADER = struct.Struct("!IIId")


def even_spans(layers: int, members: int) -> list[LayerSpan]:
    """`layers` in `members` consecutive spans whose sizes differ by at most one."""
    bounds = [layers * i // members for i in range(members + 1)]
    return [LayerSpan(a, b) for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class Run:
    """One greedy decode: the tokens, when each was picked (perf_counter), and the ms per
    token its layers took (every member's summed) and its head took."""

    tokens: list[int]
    stamps: list[float]
    layers_ms: float
    head_ms: float

    @property
    def rate(self) -> float:
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])


def _runtime(cache_dir: str | None) -> RuntimeConfig:
    return (
        RuntimeConfig(threads=1, cache_dir=Path(cache_dir))
        if cache_dir
        else RuntimeConfig(threads=1)
    )


def _greedy(entry: EntryModel, hidden: torch.Tensor) -> int:
    return int(torch.argmax(entry.logits(hidden)).item())


def _decode(shard: Shard, session: SessionId, hidden: torch.Tensor, position: int) -> torch.Tensor:
    (out,) = shard.decode_rows([(session, hidden, position)], shard.span).outputs
    if not isinstance(out, torch.Tensor):
        raise out
    return out


class OneProcess:
    """The whole model in this process, making the ring's calls in turn."""

    def __init__(self, cache_dir: str | None) -> None:
        runtime = _runtime(cache_dir)
        context = ModelContext.open(runtime, progress=False)
        self.entry = EntryModel(context)
        self.shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
        self.prompt = self.entry.encode_chat([{"role": "user", "content": PROMPT}])
        self._runs = 0

    def run(self, tokens: int) -> Run:
        self._runs += 1
        session = SessionId(f"one-{self._runs}")
        hidden = self.shard.forward(session, self.entry.embed(self.prompt), 0)
        picked, stamps, layers_ms, head_ms = [_greedy(self.entry, hidden)], [], 0.0, 0.0
        position = len(self.prompt)
        for _ in range(tokens):
            started = time.perf_counter()
            hidden = _decode(self.shard, session, self.entry.embed(picked[-1:]), position)
            computed = time.perf_counter()
            picked.append(_greedy(self.entry, hidden))
            stamps.append(time.perf_counter())
            layers_ms += (computed - started) * 1000
            head_ms += (stamps[-1] - computed) * 1000
            position += 1
        return Run(picked, stamps, layers_ms / tokens, head_ms / tokens)


def _send(
    sock: socket.socket, session: int, position: int, hidden: torch.Tensor, ms: float
) -> None:
    body = hidden.contiguous().numpy().tobytes()
    sock.sendall(_HEADER.pack(session, position, hidden.shape[1], ms) + body)


def _receive(sock: socket.socket, width: int) -> tuple[int, int, torch.Tensor | None, float]:
    """A frame's session number, position, hidden state (None: the ring stops) and the ms
    its members' layers took so far."""
    session, position, rows, ms = _HEADER.unpack(recv_exact(sock, _HEADER.size))
    if not rows:
        return session, position, None, ms
    body = recv_exact(sock, rows * width * 4)
    return session, position, torch.frombuffer(body, dtype=torch.float32).view(1, rows, width), ms


def _hidden(sock: socket.socket, width: int) -> tuple[torch.Tensor, float]:
    """The hidden state the ring brought back to the first member, and its layers' ms."""
    _, _, hidden, ms = _receive(sock, width)
    if hidden is None:
        raise ConnectionError("the ring stopped in the middle of a run")
    return hidden, ms


def _member(
    index: int, spans: list[LayerSpan], ports: list[int], cache_dir: str | None, out: Connection
) -> None:
    """A member of the ring: its layers; the first also the entry's pieces, driven by `out`."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    runtime = _runtime(cache_dir)
    context = ModelContext.open(runtime, progress=False)
    shard = Shard.load(context, spans[index], runtime)
    entry = EntryModel(context) if index == 0 else None
    width = context.hidden_size
    onward, back = join_ring(index, ports, out)
    with torch.inference_mode():
        if entry is None:
            _serve(shard, back, onward, width)
        else:
            _drive(entry, shard, back, onward, width, out)
    onward.close()


def _serve(shard: Shard, back: socket.socket, onward: socket.socket, width: int) -> None:
    """Run each frame's rows through this member's layers and send them on, until a frame of
    no rows (passed on: the ring stops)."""
    while True:
        number, position, hidden, ms = _receive(back, width)
        if hidden is None:
            onward.sendall(_HEADER.pack(number, position, 0, ms))
            return
        session = SessionId(f"ring-{number}")
        started = time.perf_counter()
        if position == 0:  # the prompt
            out = shard.forward(session, hidden, 0)
        else:
            out = _decode(shard, session, hidden, position)
        _send(onward, number, position, out, ms + (time.perf_counter() - started) * 1000)


def _drive(
    entry: EntryModel,
    shard: Shard,
    back: socket.socket,
    onward: socket.socket,
    width: int,
    out: Connection,
) -> None:
    """The first member: a run per `(number, tokens)` asked on `out`, until `None`."""
    prompt = entry.encode_chat([{"role": "user", "content": PROMPT}])
    while (asked := out.recv()) is not None:
        number, tokens = asked
        session = SessionId(f"ring-{number}")
        hidden = shard.forward(session, entry.embed(prompt), 0)
        _send(onward, number, 0, hidden, 0.0)
        hidden, _ = _hidden(back, width)
        picked, stamps, layers_ms, head_ms = [_greedy(entry, hidden)], [], 0.0, 0.0
        position = len(prompt)
        for _ in range(tokens):
            started = time.perf_counter()
            hidden = _decode(shard, session, entry.embed(picked[-1:]), position)
            _send(onward, number, position, hidden, (time.perf_counter() - started) * 1000)
            hidden, ms = _hidden(back, width)
            returned = time.perf_counter()
            picked.append(_greedy(entry, hidden))
            stamps.append(time.perf_counter())
            layers_ms += ms
            head_ms += (stamps[-1] - returned) * 1000
            position += 1
        out.send(Run(picked, stamps, layers_ms / tokens, head_ms / tokens))
    onward.sendall(_HEADER.pack(0, 0, 0, 0.0))
    _receive(back, width)  # the stop went round


class LayerRing:
    """N member processes holding `spans`, started and stopped with the context manager."""

    def __init__(self, spans: list[LayerSpan], cache_dir: str | None) -> None:
        from swarm.demo import free_ports

        ports = free_ports(len(spans))
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._procs = []
        for i in range(len(spans)):
            mine, theirs = context.Pipe()
            proc = context.Process(target=_member, args=(i, spans, ports, cache_dir, theirs))
            proc.start()
            self._pipes.append(mine)
            self._procs.append(proc)
        self._runs = 0

    def __enter__(self) -> LayerRing:
        for pipe in self._pipes:
            if pipe.recv() != "listening":
                raise RuntimeError("a ring member did not start")
        for pipe in self._pipes:
            pipe.send("go")
        return self

    def run(self, tokens: int) -> Run:
        self._runs += 1
        self._pipes[0].send((self._runs, tokens))
        run: Run = self._pipes[0].recv()
        return run

    def __exit__(self, *_: object) -> None:
        self._pipes[0].send(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


@dataclass(frozen=True)
class Row:
    members: int
    ring: float  # tok/s, median
    one: float  # tok/s, median of the runs alternated with the ring's
    ratio: float  # median of the pairs' ratios
    ring_layers_ms: float  # per token, every member's layers summed
    one_layers_ms: float
    ring_head_ms: float  # per token: the head and the greedy pick, on the first member
    one_head_ms: float

    @property
    def overhead_ms(self) -> float:
        """Per hop: what a token took beyond one process's, a frame per member."""
        return (1000 / self.ring - 1000 / self.one) / self.members

    @property
    def layers_excess_ms(self) -> float:
        return (self.ring_layers_ms - self.one_layers_ms) / self.members


def measure(
    spans: list[LayerSpan], one: OneProcess, tokens: int, repeats: int, cache_dir: str | None
) -> Row:
    pairs: list[tuple[Run, Run]] = []
    with LayerRing(spans, cache_dir) as ring:
        ring.run(tokens)  # warms the members up
        for _ in range(repeats):
            alone, split = one.run(tokens), ring.run(tokens)
            if split.tokens != alone.tokens:
                raise SystemExit(
                    f"the {len(spans)}-member ring decoded other tokens than one process"
                )
            pairs.append((alone, split))
    return Row(
        members=len(spans),
        ring=statistics.median(s.rate for _, s in pairs),
        one=statistics.median(a.rate for a, _ in pairs),
        ratio=statistics.median(s.rate / a.rate for a, s in pairs),
        ring_layers_ms=statistics.median(s.layers_ms for _, s in pairs),
        one_layers_ms=statistics.median(a.layers_ms for a, _ in pairs),
        ring_head_ms=statistics.median(s.head_ms for _, s in pairs),
        one_head_ms=statistics.median(a.head_ms for a, _ in pairs),
    )


def print_header() -> None:
    print(
        f"{'members':8}{'tok/s':>8}{'1 process':>11}{'ratio':>7}{'overhead/hop':>14}"
        f"{'layers ms/token':>17}{'1 process':>11}{'excess/hop':>12}{'rest/hop':>10}"
        f"{'head ms':>9}{'1 process':>11}"
    )


def print_row(r: Row) -> None:
    print(
        f"{r.members:<8}{r.ring:8.1f}{r.one:11.1f}{r.ratio:7.2f}{r.overhead_ms:14.3f}"
        f"{r.ring_layers_ms:17.3f}{r.one_layers_ms:11.3f}{r.layers_excess_ms:12.3f}"
        f"{r.overhead_ms - r.layers_excess_ms:10.3f}{r.ring_head_ms:9.3f}{r.one_head_ms:11.3f}",
        flush=True,
    )


def main() -> None:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--members", default="2,3", help="comma-separated ring sizes")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(m) for m in args.members.split(",") if m]
    if any(m < 2 for m in sizes):
        parser.error("--members takes ring sizes of at least 2")
    one = OneProcess(args.cache_dir)
    one.run(args.tokens)  # warms it up
    layers = one.shard.span.end
    print(f"greedy decode, {args.tokens} tokens, one torch thread per process, ", end="")
    print(f"median of {args.repeats}, each ring run alternated with one of one process")
    print_header()
    for members in sizes:
        print_row(
            measure(even_spans(layers, members), one, args.tokens, args.repeats, args.cache_dir)
        )


if __name__ == "__main__":
    main()
