"""Fast links over real loopback sockets: the compute thread reads what an authenticated peer
sends, frame by frame, and a stranger, a bad frame or an oversized length closes that
connection only."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import torch

from harness.polling import until
from swarm.config import NetConfig
from swarm.logs import Refusals
from swarm.net.fast_links import FastLinks, FastListener
from swarm.net.ports import bind_fast_port
from swarm.runtime.execution.compute import ComputeThread
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import CloseSession, FrameCodec, Hop, LinkHello, Peer, Received, StepMessage
from swarm.wire.auth import SwarmKeys

KEY = SwarmKeys.derive(b"k" * 32).frame
OTHER_KEY = SwarmKeys.derive(b"x" * 32).frame
CONFIG = NetConfig(connect_timeout_s=2.0, send_timeout_s=2.0, header_timeout_s=1.0)


def _step(number: int) -> StepMessage:
    hop = Hop(NodeId("receiver"), "127.0.0.1:1", LayerSpan(0, 2))
    entry = Peer(NodeId("entry"), "127.0.0.1:2")
    hidden = torch.full((1, 1, 8), float(number))
    return StepMessage(SessionId("s"), number, number, hidden, (hop,), entry, ())


class _Node:
    """A receiving node: its compute thread, a listener and what reached the thread."""

    def __init__(self) -> None:
        import logging

        self.codec = FrameCodec(KEY, NodeId("receiver"))
        self.compute = ComputeThread()
        self.got: list[tuple[Received, bool]] = []  # each frame and whether on the thread
        self.refusals = Refusals(logging.getLogger("test"), "a fast link")
        listening = bind_fast_port("127.0.0.1", 0, 0)
        self.listener = FastListener(
            self.codec, CONFIG, self.compute, self._sink, self.refusals, listening
        )
        self.port = self.listener.port

    def _sink(self, received: Received, ms: float, at: float) -> None:
        self.got.append((received, self.compute.on_thread()))

    async def close(self) -> None:
        await self.listener.close()
        self.compute.close()


async def _serving() -> tuple[_Node, asyncio.Task[None]]:
    node = _Node()
    return node, asyncio.create_task(node.listener.accept())


async def _stop(node: _Node, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await node.close()


async def test_frames_reach_the_compute_thread_in_order_from_either_thread() -> None:
    node, task = await _serving()
    sender = FastLinks(FrameCodec(KEY, NodeId("sender")), CONFIG)
    try:
        address = "127.0.0.1:1"
        sender.learn(address, NodeId("receiver"), node.port)
        await until(lambda: sender.has(address), "the fast link opening", 5.0)
        assert sender.send(address, _step(1), wait=False)  # as the event loop sends
        ok = await asyncio.to_thread(sender.send, address, _step(2), wait=True)  # as a thread
        assert ok
        assert not sender.send(address, CloseSession(SessionId("s")), wait=False)  # not its kind
        await until(lambda: len(node.got) == 2, "both steps arriving", 5.0)
        steps = [received.message for received, _ in node.got]
        assert [s.step for s in steps if isinstance(s, StepMessage)] == [1, 2]
        assert all(on_thread for _, on_thread in node.got)
        assert node.got[0][0].sender == "sender"
        torch.testing.assert_close(steps[1].hidden, _step(2).hidden)  # type: ignore[union-attr]
    finally:
        await sender.close()
        await _stop(node, task)


async def test_no_link_means_the_websocket_carries_it() -> None:
    sender = FastLinks(FrameCodec(KEY, NodeId("sender")), CONFIG)
    assert not sender.send("127.0.0.1:1", _step(1), wait=True)
    sender.learn("127.0.0.1:1", NodeId("receiver"), _free_port())  # nobody listens there
    await asyncio.sleep(0.2)
    assert not sender.has("127.0.0.1:1")
    assert not sender.send("127.0.0.1:1", _step(1), wait=True)
    await sender.close()


async def test_a_stranger_is_refused_and_the_link_stays_unused() -> None:
    node, task = await _serving()
    stranger = FastLinks(FrameCodec(OTHER_KEY, NodeId("stranger")), CONFIG)
    try:
        stranger.learn("127.0.0.1:1", NodeId("receiver"), node.port)
        await until(lambda: node.refusals.counts.get("wrong_key", 0) == 1, "the hello refused", 5.0)
        await asyncio.sleep(0.1)
        assert not stranger.has("127.0.0.1:1")
        assert node.got == []
    finally:
        await stranger.close()
        await _stop(node, task)


async def test_a_bad_frame_or_an_oversized_length_closes_that_connection_only() -> None:
    node, task = await _serving()
    good = FastLinks(FrameCodec(KEY, NodeId("good")), CONFIG)
    try:
        good.learn("127.0.0.1:1", NodeId("receiver"), node.port)
        await until(lambda: good.has("127.0.0.1:1"), "the fast link opening", 5.0)
        for payload in (b"not a frame at all", None):
            raw = await asyncio.to_thread(_hello_then, node.port, payload)
            assert raw == b""  # the receiver closed it
        assert node.refusals.counts.get("bad_frame", 0) == 2
        assert good.send("127.0.0.1:1", _step(7), wait=False)  # the honest link still works
        await until(lambda: len(node.got) == 1, "the honest step arriving", 5.0)
    finally:
        await good.close()
        await _stop(node, task)


def _hello_then(port: int, payload: bytes | None) -> bytes:
    """Open a link with a valid hello, then send `payload` as a frame (None: a length over
    the limit); what the receiver sends back before it closes."""
    codec = FrameCodec(KEY, NodeId("rogue"))
    hello = codec.encode(LinkHello(), NodeId("receiver"), compress=False)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack(">I", len(hello)) + hello)
        assert sock.recv(1) == b"\x01"
        if payload is None:
            sock.sendall(struct.pack(">I", 2**31))
        else:
            sock.sendall(struct.pack(">I", len(payload)) + payload)
        return sock.recv(16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_worker_runs_readers_and_the_hook_on_its_thread_between_jobs() -> None:
    compute = ComputeThread()
    a, b = socket.socketpair()
    seen: list[str] = []
    thread: list[bool] = []

    def reader() -> bool:
        data = a.recv(16)
        seen.append(data.decode())
        thread.append(compute.on_thread())
        return data != b"end"

    try:
        compute.watch(a, reader)
        compute.after_reads(lambda: seen.append("hook"))
        b.sendall(b"one")
        await until(lambda: "hook" in seen, "the hook running", 5.0)
        assert await compute.run(threading.get_ident) != threading.get_ident()
        b.sendall(b"end")
        await until(lambda: seen.count("hook") == 2, "the hook running again", 5.0)
        b.sendall(b"after")  # unregistered: nobody reads it
        await compute.run(lambda: None)
        assert seen == ["one", "hook", "end", "hook"]
        assert all(thread)
    finally:
        compute.close()
        a.close()
        b.close()


def test_only_decode_and_verify_steps_results_and_errors_travel_fast() -> None:
    from dataclasses import replace

    from swarm.net.fast_links import travels_fast
    from swarm.wire import ErrorCode, ErrorMessage, ResultMessage

    step = _step(1)
    chunk = replace(step, hidden=torch.zeros(1, 5, 8))  # a prefill chunk keeps its order
    assert travels_fast(step)
    assert not travels_fast(chunk)
    # a verify step's rows are decode positions: its hop's compute thread batches it
    assert travels_fast(replace(step, hidden=torch.zeros(1, 3, 8), verify=True))
    assert travels_fast(ResultMessage(SessionId("s"), 1, 1, torch.zeros(1, 1, 8)))
    error = ErrorMessage(SessionId("s"), 1, ErrorCode.INTERNAL, "x", NodeId("n"))
    assert travels_fast(error)
    assert not travels_fast(CloseSession(SessionId("s")))
