"""How a `swarm` command ends when something is wrong: its exit status, and a reader that
went away.

A wrong start (a flag, a config value, a file or a model that cannot be used, a port that
is taken) exits 2, as argparse does for a flag it does not know: nothing ran, and running the
same command again fails the same way. A failure of something that did start (a node that
cannot be reached, a hop that failed, an answer that broke off) exits 1. Either is one line
on stderr, never a traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from swarm.errors import (
    ConfigError,
    ModelError,
    NoChatTemplateError,
    SamplingError,
    SpanError,
    SwarmError,
    TransferError,
)

WRONG_START = 2
FAILED = 1
# what a shell reports for a tool that SIGPIPE ended (`yes | head -1`): swarm keeps SIGPIPE
# ignored, as asyncio needs for its sockets, and ends the same way by hand
BROKEN_PIPE = 128 + signal.SIGPIPE

# errors of what the command was given; TransferError is a ModelError but a network's
_WRONG_STARTS = (ConfigError, SpanError, ModelError, SamplingError, NoChatTemplateError)
_FAILURES = (TransferError,)


def exit_status(error: SwarmError) -> int:
    """WRONG_START for an error in what the command was given, else FAILED."""
    if isinstance(error, _WRONG_STARTS) and not isinstance(error, _FAILURES):
        return WRONG_START
    return FAILED


def quiet_stdout() -> None:
    """The reader of stdout went away (`swarm status | head -2`): point stdout at /dev/null,
    so that the interpreter's last flush at exit finds nowhere to fail either."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def quiet_triton_teardown() -> None:
    """Where this process imported Triton (torch does, for its optional ops, wherever Triton
    is installed), the interpreter's shutdown prints hundreds of "leaked function" lines from
    Triton's compiled bindings: a known false alarm that Triton mutes in its own workers the
    same way. Called once swarm has said all it will say, on a return, never on an uncaught
    exception, so a traceback still shows."""
    if not any(name.split(".")[0] == "triton" for name in sys.modules):
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
