"""`swarm chat`: a conversation in the terminal, with a running swarm (--node) or with the
model loaded in this process (as `swarm generate` without --node).

The prompt is read with input() in the main thread and each answer streams in an
asyncio.Runner: Ctrl-C while an answer streams cancels it (Runner.run cancels its task on
SIGINT), which closes the request, so the node stops generating; the words so far stay in the
conversation. Ctrl-C (or Ctrl-D) at the prompt leaves."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from swarm.errors import NoChatTemplateError, SwarmError
from swarm.sampling_settings import SamplingSettings

if TYPE_CHECKING:
    from swarm.client import SwarmClient
    from swarm.config import RuntimeConfig

Message = dict[str, str]
# the conversation so far -> the answer's text, piece by piece as it streams
Answerer = Callable[[list[Message]], AsyncIterator[str]]

HELP = (
    "type a message and press Enter; /reset forgets the conversation, /system TEXT sets the "
    "system prompt (/system alone clears it), /exit leaves; Ctrl-C stops an answer, and at "
    "the prompt leaves"
)


@dataclass
class Conversation:
    system: str = ""
    turns: list[Message] = field(default_factory=list)

    def messages(self) -> list[Message]:
        first = [{"role": "system", "content": self.system}] if self.system else []
        return first + self.turns


@dataclass(frozen=True)
class Said:
    """What a line typed at the prompt asks for: a reply to print, a message to answer, or
    leaving."""

    reply: str = ""
    message: str = ""
    leave: bool = False


def read_line(line: str, conversation: Conversation) -> Said:
    """Apply a command to `conversation`, or hand back the message to send. Pure but for
    the conversation it changes."""
    text = line.strip()
    if not text:
        return Said()
    if not text.startswith("/"):
        return Said(message=text)
    command, _, rest = text.partition(" ")
    if command == "/reset":
        conversation.turns.clear()
        kept = " (the system prompt stays)" if conversation.system else ""
        return Said(reply=f"[conversation cleared{kept}]")
    if command == "/system":
        conversation.system = rest.strip()
        return Said(reply="[system prompt set]" if conversation.system else "[no system prompt]")
    if command in ("/exit", "/quit"):
        return Said(leave=True)
    if command == "/help":
        return Said(reply=HELP)
    return Said(reply=f"[unknown command {command}; /help lists them]")


def chat(
    start: Coroutine[Any, Any, Answerer], conversation: Conversation, out: TextIO = sys.stdout
) -> int:
    """The prompt loop, after `start` (run in the loop the answers stream in) gave the
    answerer; returns the exit code."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    with asyncio.Runner() as runner:
        answer = runner.run(start)
        print(f"[{HELP}]", file=out, flush=True)
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print(file=out)
                return 0
            said = read_line(line, conversation)
            if said.leave:
                return 0
            if said.reply:
                print(said.reply, file=out, flush=True)
            if said.message:
                _turn(runner, answer, conversation, said.message, out)


def _turn(
    runner: asyncio.Runner,
    answer: Answerer,
    conversation: Conversation,
    message: str,
    out: TextIO,
) -> None:
    conversation.turns.append({"role": "user", "content": message})
    pieces: list[str] = []
    try:
        runner.run(_stream(answer(conversation.messages()), pieces, out))
        print(file=out, flush=True)
    except KeyboardInterrupt:
        print("\n[stopped]", file=out, flush=True)
    except SwarmError as e:
        print(f"\nswarm: error: {e}", file=sys.stderr, flush=True)
        if not pieces:  # nothing answered: the message can be sent again
            conversation.turns.pop()
            return
    conversation.turns.append({"role": "assistant", "content": "".join(pieces)})


async def _stream(pieces: AsyncIterator[str], into: list[str], out: TextIO) -> None:
    async for piece in pieces:
        into.append(piece)
        out.write(piece)
        out.flush()


async def remote(client: SwarmClient, settings: SamplingSettings) -> Answerer:
    """Answers from a running swarm (its /v1/chat/completions, streamed); the node is asked
    for its status first, so a wrong address or token fails before the first prompt."""
    from swarm.client import sampling_fields

    await client.status()

    async def answer(messages: list[Message]) -> AsyncIterator[str]:
        body = {"messages": messages, **sampling_fields(settings)}
        async for chunk in client.chat(body):
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    yield text

    return answer


async def local(
    runtime: RuntimeConfig, settings: SamplingSettings, closing: contextlib.ExitStack
) -> Answerer:
    """Answers from the whole model loaded here; `closing` stops its compute thread."""
    from swarm.inference.generation import Chunk, generate
    from swarm.inference.local import load_local

    local = await load_local(runtime)
    closing.callback(local.compute.close)
    if not local.entry.has_chat_template:
        raise NoChatTemplateError("this model has no chat template (a base model) to chat with")

    async def answer(messages: list[Message]) -> AsyncIterator[str]:
        prompt = local.entry.encode_chat(messages)
        async for event in generate(local.entry, local.pipeline, local.compute, prompt, settings):
            if isinstance(event, Chunk) and event.text:
                yield event.text

    return answer
