"""`swarm chat`: the commands typed at its prompt (a table), and the command as a user runs it
in a terminal (a pty): against a real node, an answer streams in, the conversation is kept,
Ctrl-C stops an answer mid-way (the node sees the request go away), /reset forgets, Ctrl-C
at the prompt leaves; in-process without --node."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster, newest_request, serving_cluster
from harness.paths import MODEL_CACHE
from harness.polling import DidNotHappen, until
from swarm.chat_terminal import HELP, Conversation, Said, read_line
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.schema import RequestRecord

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")  # what readline may add around a line


@pytest.mark.parametrize(
    ("line", "said", "system", "turns_after"),
    [
        ("", Said(), "be brief", 2),
        ("  hello  ", Said(message="hello"), "be brief", 2),
        ("/reset", Said(reply="[conversation cleared (the system prompt stays)]"), "be brief", 0),
        ("/system  be a pirate ", Said(reply="[system prompt set]"), "be a pirate", 2),
        ("/system", Said(reply="[no system prompt]"), "", 2),
        ("/exit", Said(leave=True), "be brief", 2),
        ("/quit", Said(leave=True), "be brief", 2),
        ("/help", Said(reply=HELP), "be brief", 2),
        ("/nope x", Said(reply="[unknown command /nope; /help lists them]"), "be brief", 2),
    ],
)
def test_what_a_line_at_the_prompt_does(
    line: str, said: Said, system: str, turns_after: int
) -> None:
    conversation = Conversation(
        "be brief", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]
    )
    assert read_line(line, conversation) == said
    assert conversation.system == system and len(conversation.turns) == turns_after


def test_the_system_prompt_comes_first() -> None:
    conversation = Conversation("be brief", [{"role": "user", "content": "hi"}])
    assert [m["role"] for m in conversation.messages()] == ["system", "user"]
    assert Conversation().messages() == []


class Terminal:
    """`python -m swarm ARGS` on a pty of its own, as a person at a terminal runs it."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "TERM": "dumb", "SWARM_RUNTIME_CACHE_DIR": str(MODEL_CACHE)}
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal, so ^C is SIGINT
            # as in a person's shell: a test run started in the background (`cmd &` in a
            # script) ignores SIGINT, and an exec'd child would inherit that
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, "-m", "swarm", *args], env)
        self.pid, self.fd = pid, fd
        self.seen = ""  # everything printed so far, escapes removed
        self.code: int | None = None  # the exit code, once it exited

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def read_until(self, pattern: str, timeout_s: float = 120.0, start: int = 0) -> re.Match[str]:
        """Read until `pattern` matches what was printed after `start`."""
        deadline = time.monotonic() + timeout_s
        while (found := re.search(pattern, self.seen[start:], re.DOTALL)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[start:]!r}"
            if select.select([self.fd], [], [], min(left, 1.0))[0]:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:  # the child exited and closed its side
                    data = b""
                assert data, f"exited before {pattern!r}: {self.seen[start:]!r}"
                self.seen += _ESCAPES.sub("", data.decode(errors="replace"))
        return found

    def interrupt_at_prompt(self) -> None:
        """Ctrl-C once the prompt waits for a key. Earlier, between printing the prompt and
        waiting, the signal would be taken but not acted on until the next key (readline's
        race, which a person's typing never meets)."""

        def waits_for_a_key() -> bool:
            try:
                waits_in = Path(f"/proc/{self.pid}/wchan").read_text()
            except OSError:
                return True  # it exited: nothing to wait for
            # select(), where readline waits for a key (the loop waits in epoll)
            return waits_in.startswith(("poll_schedule_timeout", "do_select", "core_sys_select"))

        with contextlib.suppress(DidNotHappen):  # after 5 s it gets its Ctrl-C all the same
            asyncio.run(until(waits_for_a_key, "the prompt waiting for a key", 5, every_s=0.05))
        self.type("\x03")

    def wait(self, timeout_s: float = 30.0) -> int:
        def exited() -> bool:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
            return pid != 0

        def still_running() -> str:
            return f"the command exiting (it printed {self.seen[-2000:]!r})"

        try:
            asyncio.run(until(exited, still_running, timeout_s))
        except DidNotHappen:
            os.kill(self.pid, signal.SIGKILL)
            raise
        assert self.code is not None
        return self.code

    def close(self) -> None:
        if self.code is None and os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture(scope="module")
def one_node(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from serving_cluster(smol_runtime, tmp_path_factory, [["--threads", "1"]])


def _requests(address: str) -> tuple[RequestRecord, ...]:
    return asyncio.run(SwarmClient(address).status()).recent_requests


def _last_request(address: str, count: int) -> RequestRecord:
    """The newest of the node's recent requests once it has recorded `count` of them."""
    return asyncio.run(newest_request(address, count))


@pytest.mark.slow
def test_a_conversation_with_a_node_in_a_terminal(one_node: Cluster) -> None:
    address = one_node.addresses[0]
    before = len(_requests(address))
    term = Terminal("chat", "--node", address, "--max-tokens", "300")
    try:
        term.read_until(r"Ctrl-C stops an answer.*\n> $")
        mark = len(term.seen)
        term.type("What is the capital of France?\n")
        term.read_until(r"Paris.*\n> $", start=mark)
        first = _last_request(address, before + 1)
        assert first.outcome in ("stop", "length")

        # the second question is sent with the first and its answer
        mark = len(term.seen)
        term.type("Write a long story about a dragon who learns to cook.\n")
        term.read_until(r"cook\.\n.{40}", start=mark)  # the echo, then part of the answer
        term.type("\x03")  # Ctrl-C while it streams
        term.read_until(r"\[stopped\]\n> $", start=mark)
        stopped = _last_request(address, before + 2)
        assert stopped.outcome == "disconnected" and stopped.completion_tokens < 300
        assert stopped.prompt_tokens > first.prompt_tokens + first.completion_tokens

        mark = len(term.seen)
        term.type("/reset\n")
        term.read_until(r"\[conversation cleared\]\n> $", start=mark)
        mark = len(term.seen)
        term.type("What is the capital of France?\n")
        term.read_until(r"Paris.*\n> $", start=mark)
        again = _last_request(address, before + 3)
        assert again.prompt_tokens == first.prompt_tokens  # the conversation starts over

        term.interrupt_at_prompt()  # Ctrl-C at the prompt leaves
        assert term.wait() == 0
    finally:
        term.close()


@pytest.mark.slow
def test_without_a_node_it_chats_in_this_process(tmp_path: Path) -> None:
    term = Terminal("chat", "--max-tokens", "24", "--system", "Answer in one word.")
    try:
        term.read_until(r"Ctrl-C stops an answer.*\n> $", timeout_s=240)
        mark = len(term.seen)
        term.type("What is the capital of France?\n")
        term.read_until(r"Paris.*\n> $", start=mark)
        term.type("\x04")  # Ctrl-D leaves too
        assert term.wait() == 0
    finally:
        term.close()


def test_a_node_that_is_not_there_is_one_line() -> None:
    term = Terminal("chat", "--node", "127.0.0.1:9")
    try:
        term.read_until(r"swarm: error: cannot reach the node at http://127.0.0.1:9")
        assert term.wait() == 1
    finally:
        term.close()
