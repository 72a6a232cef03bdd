"""The decisions behind a node's start, as tables: which fast port it takes, when a bind
failure says what, whether a secret file is open to others, whether a model reference may be
asked of peers, a command's exit status, and when a --join address that does not answer is
warned about again. tests/test_wrong_starts.py runs them as a user meets them."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from pathlib import Path

import pytest

from swarm.config import DEFAULT_PORT, ApiConfig, Config, MembershipConfig, NetConfig, NodeConfig
from swarm.errors import (
    BindError,
    CacheWriteError,
    ComputeError,
    ConfigError,
    CorruptModelError,
    HopFailedError,
    LinkError,
    ModelNotFoundError,
    NoChatTemplateError,
    NodeLeavingError,
    NoRouteError,
    SamplingError,
    SecretError,
    SpanError,
    StatusFormatError,
    SwarmError,
    TransferError,
    UnsupportedModelError,
)
from swarm.exits import FAILED, WRONG_START, exit_status
from swarm.membership.rejoin import Unanswered, warn_unanswered
from swarm.net import ports
from swarm.net.ports import (
    FAST_PORT,
    NODE_PORT,
    FastPortChoice,
    Listener,
    bind_failure,
    bind_ports,
    fast_port_choice,
    listening_inodes,
    port_holder,
)
from swarm.private_files import open_to_others, warn_open_secret_files
from swarm.transfer.supply import peers_may_serve


@pytest.mark.parametrize(
    ("node_port", "configured", "choice"),
    [
        (DEFAULT_PORT, 0, FastPortChoice(7421, fallback=True)),  # the README's 7420:7421
        (DEFAULT_PORT, 9000, FastPortChoice(9000, fallback=False)),  # named: taken fails
        (18101, 0, FastPortChoice(0, fallback=False)),  # never 18102: the next node's
        (18101, 18102, FastPortChoice(18102, fallback=False)),  # unless named
        (0, 0, FastPortChoice(0, fallback=False)),
        (65535, 0, FastPortChoice(0, fallback=False)),
    ],
)
def test_which_fast_port_a_node_asks_for(
    node_port: int, configured: int, choice: FastPortChoice
) -> None:
    assert fast_port_choice(node_port, configured) == choice


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    ("listener", "error", "holder", "line"),
    [
        (
            NODE_PORT,
            _os_error(errno.EADDRINUSE),
            "pid 12 (swarm node)",
            "port 7420 is already in use by pid 12 (swarm node): stop it, or choose another --port",
        ),
        (
            FAST_PORT,
            _os_error(errno.EADDRINUSE),
            None,
            "fast port 7420 is already in use by another program: stop it, or choose another "
            "--fast-port",
        ),
        (
            NODE_PORT,
            _os_error(errno.EACCES),
            None,
            "cannot listen on port 7420: permission denied (ports below 1024 need root)",
        ),
        (
            NODE_PORT,
            _os_error(errno.EADDRNOTAVAIL),
            None,
            "cannot listen on 10.9.9.9:7420: 10.9.9.9 is not an address of this machine (--host)",
        ),
        (
            NODE_PORT,
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            None,
            "cannot listen on 10.9.9.9:7420: 10.9.9.9 is not a known host name (--host)",
        ),
        (
            FAST_PORT,
            _os_error(errno.EINVAL),
            None,
            "cannot listen on fast port 7420 of 10.9.9.9: Invalid argument",
        ),
    ],
)
def test_what_a_failed_bind_says(
    listener: Listener, error: OSError, holder: str | None, line: str
) -> None:
    assert bind_failure(listener, "10.9.9.9", 7420, error, holder) == line


def _table(*rows: tuple[str, str, int]) -> str:
    """/proc/net/tcp text: its header, then a line per (local address, state, inode)."""
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    lines = [
        f"  {i}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 1000 0 "
        f"{inode} 1 0000000000000000 100 0 0 10 0"
        for i, (local, state, inode) in enumerate(rows)
    ]
    return "\n".join([header, *lines]) + "\n"


_TCP = _table(
    ("0100007F:4675", "0A", 4242),
    ("0100007F:4675", "01", 4343),  # a connection on that port, not a listener
    ("00000000:4676", "0A", 4444),
    ("0100007F:4677", "0A", 0),  # no inode: a socket being torn down
)
_TCP6 = _table(("00000000000000000000000000000000:4675", "0A", 5151))


@pytest.mark.parametrize(
    ("table", "port", "inodes"),
    [
        (_TCP, 0x4675, {4242}),  # listening; the connection on the same port is not
        (_TCP, 0x4676, {4444}),  # on every address
        (_TCP, 0x4677, set()),  # no inode: a socket being torn down
        (_TCP, 0x4678, set()),
        (_TCP6, 0x4675, {5151}),
        ("", 0x4675, set()),
    ],
)
def test_which_sockets_listen_on_a_port(table: str, port: int, inodes: set[int]) -> None:
    assert listening_inodes(table, port) == inodes


def test_a_taken_port_names_the_process_holding_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        holder = port_holder(port)
        if holder is None:
            pytest.skip("/proc does not say who listens where")
        assert holder.startswith(f"pid {os.getpid()} (")
        with pytest.raises(BindError, match=f"^port {port} is already in use by pid {os.getpid()}"):
            bind_ports(NodeConfig(port=port), NetConfig())
        with pytest.raises(BindError, match=f"^fast port {port} is already in use by pid"):
            bind_ports(NodeConfig(port=0), NetConfig(fast_port=port))


def test_a_node_beside_another_port_leaves_the_next_port_free() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ports = bind_ports(NodeConfig(port=port), NetConfig())
    try:
        assert ports.http_port == port
        assert ports.fast is not None and ports.fast.getsockname()[1] != port + 1
    finally:
        ports.close()
    off = bind_ports(NodeConfig(port=0), NetConfig(fast_links=False))
    assert off.fast is None
    off.close()


def test_a_system_pick_beside_the_node_port_is_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        beside = probe.getsockname()[1]  # free: what the system's first pick is made to be
    real, asked = ports.bind_port, []

    def first_pick_beside(host: str, port: int, listener: Listener) -> socket.socket:
        asked.append(port)
        return real(host, beside if len(asked) == 1 else port, listener)

    monkeypatch.setattr(ports, "bind_port", first_pick_beside)
    sock = ports.bind_fast_port("127.0.0.1", beside - 1, 0)
    try:
        assert asked == [0, 0] and sock.getsockname()[1] != beside
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("mode", "open_"),
    [
        (0o600, False),
        (0o400, False),
        (0o700, False),
        (stat.S_IFREG | 0o600, False),  # st_mode carries the file type
        (0o4600, False),  # and set-id bits
        (0o640, True),  # group may read
        (0o644, True),  # anyone may read: the README's `> api.token` under umask 022
        (0o604, True),
        (0o620, True),  # group may replace it
        (stat.S_IFREG | 0o666, True),
    ],
)
def test_whether_a_secret_file_is_open_to_others(mode: int, open_: bool) -> None:
    assert open_to_others(mode) is open_


def test_a_node_warns_once_about_each_secret_file_open_to_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret, token = tmp_path / "swarm.key", tmp_path / "api.token"
    for path, mode in ((secret, 0o644), (token, 0o600)):
        path.write_text("x\n")
        path.chmod(mode)
    config = Config(node=NodeConfig(secret_file=secret), api=ApiConfig(token_file=token))
    with caplog.at_level(logging.WARNING, logger="swarm.private_files"):
        warn_open_secret_files(config)
        warn_open_secret_files(Config(api=ApiConfig(token_file=tmp_path / "missing")))
    assert [r.getMessage() for r in caplog.records] == [
        f"node.secret_file {secret} is open to users other than its owner (mode 0644): "
        f"run chmod 600 {secret}"
    ]


@pytest.mark.parametrize(
    ("ref", "exists_here", "asked"),
    [
        ("3f9a0c1d2e4b", False, True),  # a model id `swarm status` shows
        ("smollm2-135m-instruct", False, True),  # a name
        ("qwen2.5-0.5b-instruct-q4_k_m", False, True),  # a name with a dot is a name
        ("notes.txt", True, False),  # a file here: what the user meant, though not a model
        ("some-folder", True, False),
        ("/no/such.gguf", False, False),  # a path never names a peer's model
        ("such.gguf", False, False),
        ("./model", False, False),
        ("~/models/x", False, False),
    ],
)
def test_which_model_references_peers_are_asked_for(
    ref: str, exists_here: bool, asked: bool
) -> None:
    assert peers_may_serve(ref, exists_here) is asked


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("x"), WRONG_START),
        (SecretError("x"), WRONG_START),
        (BindError("x"), WRONG_START),
        (SpanError("x"), WRONG_START),
        (ModelNotFoundError("x"), WRONG_START),
        (CorruptModelError("x"), WRONG_START),
        (UnsupportedModelError("x"), WRONG_START),
        (CacheWriteError("x"), WRONG_START),
        (SamplingError("x"), WRONG_START),
        (NoChatTemplateError("x"), WRONG_START),
        (TransferError("x"), FAILED),  # a peer or hub out of reach may answer next time
        (LinkError("x"), FAILED),
        (HopFailedError("x"), FAILED),
        (NoRouteError("x", ()), FAILED),
        (NodeLeavingError("x"), FAILED),
        (ComputeError("x"), FAILED),
        (StatusFormatError("x"), FAILED),
    ],
)
def test_exit_status(error: SwarmError, status: int) -> None:
    assert exit_status(error) == status


def test_warnings_about_an_unanswered_join_back_off() -> None:
    config = MembershipConfig(rejoin_interval_s=1.0, rejoin_max_interval_s=5.0)
    state, warned_at = Unanswered(), []
    for tenth in range(0, 300):  # a join every 0.1 s for 30 s
        now = tenth / 10
        state, due = warn_unanswered(state, now, config)
        if due:
            warned_at.append(now)
    # at once, then 1, 2, 4 s apart, then every 5 s
    assert warned_at == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0, 22.0, 27.0]
