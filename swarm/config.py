"""Configuration: bootstrap.toml, CLI flags and the environment merged into one frozen config.

This is the only module that reads the environment. Precedence, lowest first: the preset
(`local()` for tests, `lan()` for a home network), the TOML file, `SWARM_*` environment
variables, then explicit overrides from the command line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from swarm.errors import ConfigError, SpanError
from swarm.types import LayerSpan, split_host_port

Device = Literal["cpu", "cuda"]
# packed: GGUF's quantized blocks as they are (swarm.runtime.weights.packed); int8: weight-only,
# swarm.runtime.weights.quant
DType = Literal["packed", "float32", "bfloat16", "float16", "int8"]
ActivationCodec = Literal["raw", "int8_row", "int8_block64", "int8_hadamard64"]
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_PORT = 7420  # a node's port unless told; the README's firewall recipe opens 7420:7421
AUTO_MEMORY_FRACTION = 0.7  # of free memory, when runtime.layer_memory_bytes is 0


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "swarm" / "models"


@dataclass(frozen=True)
class RuntimeConfig:
    """How this machine runs model layers."""

    model: str = DEFAULT_MODEL  # a known name, a .gguf path, or a Hugging Face folder
    cache_dir: Path = field(default_factory=_default_cache_dir)  # per-layer cache root
    device: Device = "cpu"
    dtype: DType = "packed"  # packed: a GGUF runs from its blocks; other checkpoints in float32
    threads: int = 0  # torch intra-op threads; 0 = all cores
    kv_cache_bytes: int = 512 * 1024 * 1024  # bytes of attention cache for all sessions
    session_idle_timeout_s: float = 300.0  # seconds before an idle session's cache is evicted
    compute_queue_size: int = 64  # jobs waiting for the compute thread before callers block
    layer_memory_bytes: int = 0  # memory for decoder-layer weights; 0 = 70% of what is free
    # Bytes of `device` the node's layers, their share of the KV cache and a prefill's
    # activations may take; the span's layers past it run on the CPU in the same process
    # (docs/architecture.md, "A node that is part GPU"). 0 = the device's free memory less
    # gpu_memory_margin_bytes on cuda, no cap on cpu; on cpu a cap splits the span into two
    # groups on the CPU (the stand-in tests run the split path through)
    gpu_memory_bytes: int = 0
    gpu_memory_margin_bytes: int = 1024**3  # bytes of free device memory left to others
    gpu_only: bool = False  # refuse to start rather than run any layer past the cap on CPU
    max_batch: int = 8  # decode steps of different sessions run as one forward; 1 = no batching
    # A prefill longer than this runs as consecutive chunks of at most this many tokens, in
    # one process as across nodes (so both compute the same numbers); across several hops
    # the next hop computes chunk i while this one computes chunk i + 1. Shorter chunks
    # overlap more (k chunks over two equal hops take (k + 1) / 2k of the sum): 1024 tokens
    # through two nodes took 0.47-0.52x the sum in chunks of 128, 0.57-0.64x in chunks of 256.
    # A chunk is also what the prompt cache keeps and reuses (chunks end at multiples of this
    # size): a 10-turn chat through three nodes started its 10th turn in 1.05x the first's
    # time in chunks of 64, 1.58x in chunks of 128; one process prefills as fast in either.
    prefill_chunk_tokens: int = 64
    # Prefill chunks of several sessions that wait at a hop run as one call of up to this many
    # tokens, the session least far along first (swarm/inference/prefill_order.py), so the
    # replays a fault starts together advance chunk by chunk and resume together, and a new
    # request's prefill goes before them; 0 = each chunk alone, in arrival order. One call
    # holds the compute thread: more tokens make the decode steps waiting behind it wait longer.
    prefill_batch_tokens: int = 256
    # Keep each whole prefill chunk of a prompt at every hop past its session, within the
    # cache budget (sessions always win), and start a prompt that begins with the same
    # tokens after the chunks every hop of its route keeps (swarm.runtime.prefix_blocks):
    # a conversation's next turn or an agent's next call computes only what is new. The
    # text is the same as with it off; a request's "cache_prompt": false turns it off.
    prompt_cache: bool = True
    # As a node stops, the prompt blocks its layers keep are written to its state folder, up
    # to this many bytes (the most recently used first), and read back when it serves the
    # same layers again; 0 = never written
    prompt_cache_disk_bytes: int = 1024 * 1024 * 1024
    # swarm's compiled CPU kernels, where this CPU and the build have them; each off runs
    # torch's instead (for measuring both side by side; nodes of one swarm should agree,
    # since the two paths round differently)
    native_kernels: bool = True  # products, norms and rotary
    avx512_kernels: bool = True  # the products' AVX-512 VNNI rows (the same bits as AVX2)
    native_attention: bool = True  # a decode step's attention as one call per layer
    # a decode step through a whole Llama-shaped layer as one call (the bits of its steps)
    dense_layers: bool = True
    # TEST ONLY, never set on a real node: "layer:offset" flips every bit of one byte of
    # that decoder layer's weights in this node's memory once loaded (the byte at `offset`
    # of the layer's tensors laid end to end in name order), so a test can run a node that
    # computes wrong text, as bad memory would (SWARM_RUNTIME_TEST_FLIP_BYTE); "" = none.
    # At the layer's first load only: a reload an entry asks for (swarm/inference/reload.py)
    # reads the store without it, so that a reload really cures it, as it would bad memory
    test_flip_byte: str = ""

    def __post_init__(self) -> None:
        if self.device not in get_args(Device):
            raise ConfigError(
                f"runtime.device must be one of {get_args(Device)}, not {self.device!r}"
            )
        if self.dtype not in get_args(DType):
            raise ConfigError(f"runtime.dtype must be one of {get_args(DType)}, not {self.dtype!r}")
        if self.device == "cpu" and self.dtype == "float16":
            raise ConfigError(
                "runtime.dtype float16 needs device cuda; use float32 or bfloat16 on cpu"
            )
        _require_positive("runtime.kv_cache_bytes", self.kv_cache_bytes)
        _require_positive("runtime.session_idle_timeout_s", self.session_idle_timeout_s)
        _require_positive("runtime.compute_queue_size", self.compute_queue_size)
        if self.layer_memory_bytes < 0:
            raise ConfigError("runtime.layer_memory_bytes must be >= 0 (0 = automatic)")
        if self.threads < 0:
            raise ConfigError(f"runtime.threads must be >= 0, not {self.threads}")
        if self.gpu_memory_bytes < 0 or self.gpu_memory_margin_bytes < 0:
            raise ConfigError("runtime.gpu_memory_bytes and its margin must be >= 0")
        _require_positive("runtime.max_batch", self.max_batch)
        _require_positive("runtime.prefill_chunk_tokens", self.prefill_chunk_tokens)
        if self.prompt_cache_disk_bytes < 0:
            raise ConfigError("runtime.prompt_cache_disk_bytes must be >= 0 (0 = none on disk)")
        if self.prefill_batch_tokens < 0:
            raise ConfigError("runtime.prefill_batch_tokens must be >= 0 (0 = no batching)")
        if self.test_flip_byte:
            self.flipped_byte()  # a ConfigError naming the setting when it is not one

    def ram_for_layers(self, available: int) -> int:
        """Bytes of RAM the node's layers may take, `available` bytes being free now."""
        return self.layer_memory_bytes or int(available * AUTO_MEMORY_FRACTION)

    def flipped_byte(self) -> tuple[int, int] | None:
        """runtime.test_flip_byte as (layer, offset); None when unset."""
        if not self.test_flip_byte:
            return None
        layer, _, offset = self.test_flip_byte.partition(":")
        try:
            found = int(layer), int(offset)
        except ValueError:
            found = (-1, -1)
        if min(found) < 0:
            raise ConfigError(
                f"runtime.test_flip_byte must be layer:offset (two numbers >= 0), "
                f"not {self.test_flip_byte!r}"
            )
        return found


@dataclass(frozen=True)
class MembershipConfig:
    """SWIM timings: hashicorp/memberlist's LAN numbers, but a suspicion multiplier of 2 (not
    4), so a crash is known to 100 members within ~6 s (bench/gossip_sim.py)."""

    probe_interval_s: float = 1.0  # seconds between probes of one random member
    probe_timeout_s: float = 0.5  # seconds to wait for a direct probe's answer
    indirect_probes: int = 3  # peers asked to probe a member that missed a direct probe
    suspicion_multiplier: float = 2.0  # suspicion lasts this x log10(n+1) x probe_interval_s
    gossip_interval_s: float = 0.2  # seconds between piggyback gossip rounds
    gossip_fanout: int = 3  # peers per gossip round
    push_pull_interval_s: float = 30.0  # seconds between full state syncs with one peer
    dead_reclaim_s: float = 60.0  # seconds a dead or left member stays listed
    # healing (swarm.membership.rejoin): while a remembered or bootstrap address has no live
    # member, joins go to `rejoin_fanout` of them, first after this many seconds, then at
    # doubling intervals up to the maximum
    rejoin_interval_s: float = 5.0
    rejoin_max_interval_s: float = 60.0
    rejoin_fanout: int = 3  # addresses knocked on per attempt
    remember_for_s: float = 86400.0  # seconds an address not seen alive stays remembered

    def __post_init__(self) -> None:
        for name in (
            "probe_interval_s",
            "probe_timeout_s",
            "suspicion_multiplier",
            "gossip_interval_s",
            "push_pull_interval_s",
            "dead_reclaim_s",
            "rejoin_interval_s",
            "rejoin_max_interval_s",
            "remember_for_s",
        ):
            _require_positive(f"membership.{name}", getattr(self, name))
        for name in ("indirect_probes", "gossip_fanout", "rejoin_fanout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"membership.{name} must be >= 0")

    def suspicion_timeout_s(self, members: int) -> float:
        return self.suspicion_multiplier * max(1.0, math.log10(members + 1)) * self.probe_interval_s

    @property
    def settle_s(self) -> float:
        """Seconds the view must be quiet before a node re-plans: several gossip rounds, so
        the news of a change has reached most members, and never under a second."""
        return max(1.0, 4 * self.gossip_interval_s)


@dataclass(frozen=True)
class PlacementConfig:
    rebalance_threshold: float = 0.15  # a move must raise predicted throughput by this fraction
    cooldown_s: float = 30.0  # seconds before this node may move its span again
    span: str = ""  # "a:b": serve exactly layers [a, b), never re-planned; "" = automatic
    # seconds a moving node keeps announcing the layers it gives up while it waits for their
    # new owners to announce them; past it, it drops them anyway
    handoff_timeout_s: float = 30.0
    # seconds a move costs (weights fetched from peers, kept prompts computed again) that
    # double the gain a move must promise
    transfer_payback_s: float = 60.0

    def __post_init__(self) -> None:
        if self.span:
            try:
                LayerSpan.parse(self.span)
            except SpanError as e:
                raise ConfigError(f"placement.span: {e}") from None
        if self.rebalance_threshold < 0:
            raise ConfigError("placement.rebalance_threshold must be >= 0")
        if self.cooldown_s < 0:
            raise ConfigError("placement.cooldown_s must be >= 0")
        _require_positive("placement.handoff_timeout_s", self.handoff_timeout_s)
        _require_positive("placement.transfer_payback_s", self.transfer_payback_s)


_NET_NOT_POSITIVE = (
    "activation_codec",
    "fast_links",
    "fast_port",
    "native_frames",
    "spot_check_every",
    "test_clock_offset_s",
)


@dataclass(frozen=True)
class NetConfig:
    connect_timeout_s: float = 3.0  # seconds to open a link to a peer
    send_timeout_s: float = 10.0  # seconds one frame may take to leave
    # seconds between websocket pings on idle links; a pong later than half of it drops the
    # link, so not much lower: a busy machine must not look dead
    heartbeat_s: float = 5.0
    inbox_size: int = 256  # received frames waiting to be handled before links stop reading
    # seconds the entry waits at least for one step's result while every hop answers probes
    # (four step deadlines when that is longer): a step that is only slow (a long prefill on
    # a busy machine) is not a failure
    step_timeout_s: float = 60.0
    # A step later than max(floor, factor x the route's expected time) makes the entry probe
    # the route's hops; one that does not answer within probe_timeout_s is taken as failed.
    step_deadline_floor_s: float = 2.0  # seconds
    step_deadline_factor: float = 4.0  # times the expected time of the step
    probe_timeout_s: float = 1.5  # seconds a hop has to answer a probe
    drain_timeout_s: float = 30.0  # seconds a leaving node waits for cover and its sessions
    # seconds a request or a recovering stream waits for layers that are moving (their new
    # owner is loading them) before it fails; layers no plan can cover fail at once
    coverage_wait_s: float = 30.0
    # how this entry's steps send hidden states between hops; raw keeps greedy output exact,
    # int8 sends about a quarter of the bytes of float32 (see bench/network.py)
    activation_codec: ActivationCodec = "raw"
    rtt_probe_interval_s: float = 5.0  # seconds between rounds of round-trip probes
    rtt_probes_per_interval: int = 3  # peers probed per round, those measured longest ago
    # What a stranger on the network can hold before proving it knows the swarm secret or
    # the API token (the README's threat model). Connections beyond the caps are closed at once.
    max_connections: int = 1024  # open TCP connections to this node's port, all peers together
    max_connections_per_address: int = 256  # open TCP connections from one peer address
    header_timeout_s: float = 5.0  # seconds a new connection has to send its request's headers
    # connections from one address that have not finished their first request's headers
    max_unfinished_per_address: int = 16
    idle_timeout_s: float = 30.0  # seconds a keep-alive connection may wait for its next request
    # seconds a peer request's body (gossip, transfer) may take to arrive before it can
    # authenticate; a trickling one holds its slot no longer
    unauthenticated_body_timeout_s: float = 3.0
    # peer requests from addresses no member advertises, read at once before they
    # authenticate; members' addresses have a lane of their own, as wide per address
    max_unauthenticated: int = 16
    max_unauthenticated_per_address: int = 4  # of those, from one address
    # seconds a frame's sealing clock may run ahead of this node's; frames sealed further
    # ahead are refused (a restarted node refuses this long past its start: its previous
    # run may have taken them)
    max_clock_ahead_s: float = 2.0
    # Decode steps between nodes on plain TCP connections that the compute threads read and
    # write (swarm/net/fast_links.py), beside the websocket links; where a peer's fast port
    # cannot be reached, its websocket carries them.
    fast_links: bool = True
    # TCP port this node takes fast links on; 0: 7421 beside the default port 7420 (any free
    # port when that one is taken), else a port the system picks, never the port beside the
    # node's own, which another node on the machine may ask for (swarm/net/ports.py); peers
    # learn it from the link
    fast_port: int = 0
    # decode steps' frames sealed and opened by one C call each where swarm.wire._frames was
    # built (the same bytes as the Python path, which seals and opens every other frame)
    native_frames: bool = True
    # Spot-checks (swarm/inference/spot_checks.py): this node, as an entry, runs one step in
    # so many again through other holders of the same layers and compares the bits; a
    # member whose result differs and a third run disagrees with is left out of routes and
    # asked to reload its layers from its store.
    spot_check_every: int = 200  # steps per check, on average; 1: every step; 0: none
    # steps per check through a member that lost a check (no third run could decide, or it
    # was convicted and started again); never fewer checks than spot_check_every gives
    spot_check_every_flagged: int = 10
    # seconds: this node reloads its span from its store at an entry's request (its
    # spot-check convicted this node) at most once in this long, however many ask
    spot_check_reload_every_s: float = 600.0
    # TEST ONLY, never set on a real node: seconds added to the clock this node seals and
    # checks frames with (gossip and links), so a test can run a node whose clock is off
    # without changing the machine's (SWARM_NET_TEST_CLOCK_OFFSET_S); 0 = the real clock
    test_clock_offset_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.fast_port < 65536:
            raise ConfigError(f"net.fast_port must be a TCP port or 0, not {self.fast_port}")
        for f in dataclasses.fields(self):
            if f.name not in _NET_NOT_POSITIVE:
                _require_positive(f"net.{f.name}", getattr(self, f.name))
        if self.max_unauthenticated_per_address > self.max_unauthenticated:
            raise ConfigError(
                f"net.max_unauthenticated_per_address ({self.max_unauthenticated_per_address}) "
                f"must not be over net.max_unauthenticated ({self.max_unauthenticated})"
            )
        if self.spot_check_every < 0:
            raise ConfigError(
                f"net.spot_check_every must be >= 0 (0 = no checks), not {self.spot_check_every}"
            )
        if self.activation_codec not in get_args(ActivationCodec):
            raise ConfigError(
                f"net.activation_codec must be one of {get_args(ActivationCodec)}, "
                f"not {self.activation_codec!r}"
            )


@dataclass(frozen=True)
class TransferConfig:
    """Weights fetched from peers by nodes that do not have the model file (swarm.transfer)."""

    # bytes per second this node sends one peer: weights take at most this from a link, the
    # rest stays for activation frames; 0 = no limit
    rate_bytes_per_s: int = 64 * 1024 * 1024
    request_timeout_s: float = 30.0  # seconds one index, digest or chunk request may take
    parallel_per_peer: int = 2  # chunk requests in flight to each peer

    def __post_init__(self) -> None:
        if self.rate_bytes_per_s < 0:
            raise ConfigError("transfer.rate_bytes_per_s must be >= 0 (0 = no limit)")
        _require_positive("transfer.request_timeout_s", self.request_timeout_s)
        _require_positive("transfer.parallel_per_peer", self.parallel_per_peer)


def _default_state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "swarm"


@dataclass(frozen=True)
class NodeConfig:
    host: str = "127.0.0.1"  # address to bind; anything but loopback needs a swarm secret
    port: int = DEFAULT_PORT  # the node's one port: HTTP API, gossip and node-to-node links
    # host:port peers dial; empty = the bound address, or, bound to a wildcard, the address of
    # the route to a bootstrap peer (swarm.net.addresses)
    advertise: str = ""
    join: tuple[str, ...] = ()  # bootstrap addresses host:port
    state_dir: Path = field(default_factory=_default_state_dir)  # node id and secret live here
    secret_file: Path | None = None  # 32-byte swarm secret; None = loopback only
    # announce this node on the LAN by mDNS (swarm.net.mdns) and, without `join`, join the
    # members of its swarm announced there; off on loopback, where nobody else listens
    discover: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"node.port must be in 0..65535, not {self.port}")
        for address in self.join:
            _check_address("node.join", address)
        if self.advertise:
            _check_address("node.advertise", self.advertise)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ApiConfig:
    """The HTTP API (OpenAI-compatible routes, status, metrics, dashboard). Peers' links and
    gossip are authenticated by the swarm secret instead and never need the API token."""

    token: str = ""  # Bearer token clients must send; empty = none (loopback only)
    token_file: Path | None = None  # a file holding the token (kept out of process lists)
    max_body_bytes: int = 2 * 1024 * 1024  # bytes of one API request body; more gets 413
    max_concurrent_requests: int = 8  # generations in flight at this entry; more get 429
    retry_after_s: int = 2  # seconds a refused client is told to wait before any is measured
    queue_size: int = 16  # requests that wait for a slot once all are taken; more get 429
    queue_timeout_s: float = 30.0  # seconds a request waits in that queue before its 429
    served_model_name: str = ""  # the model id clients use; empty = the model's own name
    # seconds to connect to a member serving another model, which a request for that model
    # is sent on to; then the next such member
    forward_connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.token and self.token_file is not None:
            raise ConfigError("set api.token or api.token_file, not both")
        _require_positive("api.max_body_bytes", self.max_body_bytes)
        _require_positive("api.max_concurrent_requests", self.max_concurrent_requests)
        _require_positive("api.retry_after_s", self.retry_after_s)
        if self.queue_size < 0:
            raise ConfigError(f"api.queue_size must be >= 0, not {self.queue_size}")
        _require_positive("api.queue_timeout_s", self.queue_timeout_s)

    def resolve_token(self) -> str | None:
        """The configured token (read from token_file when given), or None."""
        if self.token_file is None:
            return self.token or None
        try:
            token = self.token_file.read_text().strip()
        except OSError as e:
            raise ConfigError(
                f"cannot read api.token_file {self.token_file}: {e.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"api.token_file {self.token_file} is not text") from None
        if not token:
            raise ConfigError(f"api.token_file {self.token_file} is empty")
        return token


def _check_address(name: str, address: str) -> None:
    try:
        split_host_port(address)
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from None


@dataclass(frozen=True)
class SpeculationConfig:
    """Speculative decoding at the entry (swarm.inference.drafting): tokens drafted by n-gram
    lookup in the prompt and the text so far, checked by the target in one verify step
    through every hop. The text is the same with it on or off; only the speed changes."""

    enabled: bool = True  # draft where a lookup finds a continuation; a request may opt out
    max_draft_tokens: int = 8  # tokens drafted per step at most (the length adapts below it)
    ngram_max: int = 6  # tokens of the text's end looked up first (then shorter ones)
    ngram_min: int = 3  # tokens of the shortest end looked up (shorter ones draft noise)
    pause_steps: int = 32  # decode steps without drafting after a verify step did not pay
    smoothing: float = 0.2  # weight of the newest step in the averages of acceptance and cost
    # a small model with the target's vocabulary (what runtime.model takes) that drafts where
    # the lookup finds nothing, whole at each entry, on its compute thread; "" = none
    draft_model: str = ""

    def __post_init__(self) -> None:
        _require_positive("speculation.max_draft_tokens", self.max_draft_tokens)
        _require_positive("speculation.ngram_min", self.ngram_min)
        if self.ngram_max < self.ngram_min:
            raise ConfigError(
                f"speculation.ngram_max must be >= speculation.ngram_min ({self.ngram_min}), "
                f"not {self.ngram_max}"
            )
        if self.pause_steps < 0:
            raise ConfigError(f"speculation.pause_steps must be >= 0, not {self.pause_steps}")
        if not 0 < self.smoothing <= 1:
            raise ConfigError(f"speculation.smoothing must be in (0, 1], not {self.smoothing}")


@dataclass(frozen=True)
class ModelEntry:
    """One of several models a node serves (`[[models]]` in bootstrap.toml, or `--model` given
    more than once): each runs as a node of its own, on ports and memory of its own."""

    model: str  # what runtime.model takes
    # bytes of memory for this model's layers; 0 = its share of runtime.layer_memory_bytes,
    # split among the models without one by their layers' bytes
    layer_memory_bytes: int = 0
    served_model_name: str = ""  # the model id clients send; empty = the model's own name


_MODELS_TABLE = "models"  # bootstrap.toml's [[models]]: an array of tables, not a section


def model_entries(raw: Any, origin: str) -> tuple[ModelEntry, ...]:
    """`[[models]]` as read from TOML, checked: each table names its model and nothing
    ModelEntry does not know."""
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise ConfigError(f'{origin}: models must be tables, each [[models]] with model = "..."')
    hints = get_type_hints(ModelEntry)
    known = {f.name for f in dataclasses.fields(ModelEntry)}
    entries = []
    for i, table in enumerate(raw, 1):
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(
                f"{origin}: unknown setting models.{unknown[0]} in [[models]] {i}; "
                f"known: {', '.join(sorted(known))}"
            )
        model = table.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f'{origin}: [[models]] {i} needs model = "..." (what --model takes)')
        values = {k: _coerce(f"models.{k}", v, hints[k]) for k, v in table.items()}
        if values.get("layer_memory_bytes", 0) < 0:
            raise ConfigError(f"{origin}: models.layer_memory_bytes must be >= 0 in [[models]] {i}")
        entries.append(ModelEntry(**{**values, "model": model.strip()}))
    return tuple(entries)


def load_models(path: Path | None) -> tuple[ModelEntry, ...]:
    """The `[[models]]` of the config file at `path`; () without a file or without any."""
    if path is None:
        return ()
    data = _read_toml(path)
    if _MODELS_TABLE not in data:
        return ()
    entries = model_entries(data[_MODELS_TABLE], str(path))
    if "model" in data.get("runtime", {}):
        raise ConfigError(f"{path}: set the model in runtime.model or in [[models]], not both")
    return entries


def without_config_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every `SWARM_<SECTION>_<FIELD>` setting and the invite: for a process
    that is given its settings whole, in a file."""
    return {
        k: v for k, v in environ.items() if k != "SWARM_INVITE" and not _from_environment({k: v})
    }


@dataclass(frozen=True)
class Config:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    net: NetConfig = field(default_factory=NetConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)

    def __post_init__(self) -> None:
        if self.net.fast_links and self.net.fast_port and self.net.fast_port == self.node.port:
            raise ConfigError(
                f"net.fast_port {self.net.fast_port} is the node's own port (node.port): "
                "give the fast links another one, or 0 for the default"
            )
        if self.node.host not in LOOPBACK_HOSTS and not (self.api.token or self.api.token_file):
            raise ConfigError(
                f"binding to {self.node.host} exposes the HTTP API, which then needs a token: "
                "set api.token_file (--api-token-file) or SWARM_API_TOKEN; clients send it as "
                "'Authorization: Bearer <token>'"
            )

    @classmethod
    def local(cls) -> Config:
        """Fast timings and small budgets, for tests on one machine."""
        return cls(
            runtime=RuntimeConfig(kv_cache_bytes=256 * 1024 * 1024, session_idle_timeout_s=60.0),
            # Several nodes computing on a two-core machine answer a ping late: a node's
            # loop waits for the CPU and for its compute thread's hold on the interpreter.
            # An ack has the whole 0.3 s interval and a suspect 1.5 s to refute, so a busy
            # node is not declared dead while it serves; a dead one is known in ~2 s.
            membership=MembershipConfig(
                probe_interval_s=0.3,
                probe_timeout_s=0.2,
                suspicion_multiplier=5.0,
                gossip_interval_s=0.05,
                push_pull_interval_s=2.0,
                dead_reclaim_s=10.0,
                rejoin_interval_s=1.0,
                rejoin_max_interval_s=5.0,
            ),
            placement=PlacementConfig(cooldown_s=2.0, handoff_timeout_s=10.0),
            # tests start nodes side by side that must stay apart unless told to join
            node=NodeConfig(discover=False),
            net=NetConfig(
                connect_timeout_s=1.0,
                step_deadline_floor_s=1.0,
                probe_timeout_s=1.0,
                drain_timeout_s=10.0,
                coverage_wait_s=10.0,
                max_clock_ahead_s=0.5,
            ),
        )

    @classmethod
    def lan(cls) -> Config:
        """A home network of a few machines."""
        return cls()


def _require_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, not {value}")


_ENV_PREFIX = "SWARM_"
_SECTIONS = ("runtime", "membership", "placement", "net", "node", "api", "transfer", "speculation")


def load_config(
    path: Path | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    preset: Literal["local", "lan"] = "lan",
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the config: preset, TOML file, `SWARM_<SECTION>_<FIELD>` variables, overrides."""
    base = Config.local() if preset == "local" else Config.lan()
    sections: dict[str, dict[str, Any]] = {f.name: {} for f in dataclasses.fields(base)}
    if path is not None:
        file = _read_toml(path)
        file.pop(_MODELS_TABLE, None)  # load_models reads it
        _merge(sections, file, str(path))
    _merge(sections, _from_environment(os.environ if environ is None else environ), "environment")
    if overrides:
        _merge(sections, {k: dict(v) for k, v in overrides.items()}, "command line")
    built = {
        name: _build_section(getattr(base, name), values, name) for name, values in sections.items()
    }
    return Config(**built)


def invite_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """SWARM_INVITE: an invite line for `swarm node` (swarm.invite), kept out of the config
    (it carries the secret, which `swarm config` would otherwise show); None when unset."""
    line = (os.environ if environ is None else environ).get("SWARM_INVITE", "").strip()
    return line or None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def _from_environment(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for key, value in environ.items():
        if not key.startswith(_ENV_PREFIX):
            continue
        rest = key[len(_ENV_PREFIX) :].lower()
        section, _, name = rest.partition("_")
        if section in _SECTIONS and name:
            found.setdefault(section, {})[name] = value
    return found


def _merge(into: dict[str, dict[str, Any]], new: Mapping[str, Any], origin: str) -> None:
    for section, values in new.items():
        if section not in into:
            raise ConfigError(f"{origin}: unknown config section [{section}]")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: [{section}] must be a table")
        into[section].update(values)


def _build_section(base: Any, values: Mapping[str, Any], section: str) -> Any:
    hints = get_type_hints(type(base))
    known = {f.name for f in dataclasses.fields(base)}
    converted: dict[str, Any] = {}
    for name, raw in values.items():
        if name not in known:
            raise ConfigError(
                f"unknown setting {section}.{name}; known: {', '.join(sorted(known))}"
            )
        converted[name] = _coerce(f"{section}.{name}", raw, hints[name])
    return dataclasses.replace(base, **converted)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_bytes(name: str, raw: str) -> int:
    """A size with a unit suffix ("24GiB", "512 MB", "1.5g"; k, m, g, t are powers of 1000,
    KiB, MiB, GiB, TiB of 1024) as whole bytes."""
    text = raw.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = text[len(number) :].strip()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ConfigError(
            f"{name} must be bytes, with a unit if you like (24GiB, 512MB), not {raw!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a size >= 0, not {raw!r}")
    return int(value)


def _coerce(name: str, raw: Any, hint: Any) -> Any:
    """Turn a TOML value or an environment string into the field's type, or say why not."""
    args = get_args(hint)
    if type(None) in args:  # X | None: an empty string or "none" means None
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
            return None
        hint = next(a for a in args if a is not type(None))
    if get_origin(hint) is tuple:
        items = raw.split(",") if isinstance(raw, str) else raw
        if isinstance(items, (list, tuple)) and all(isinstance(i, str) for i in items):
            return tuple(i.strip() for i in items if i.strip())
    elif get_origin(hint) is Literal:
        if raw in args:
            return raw
        raise ConfigError(f"{name} must be one of {args}, not {raw!r}")
    elif hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "0", "false", "no"):
            return raw.lower() in ("1", "true", "yes")
    elif hint in (int, float) and not isinstance(raw, bool):
        if isinstance(raw, (int, float)) and (hint is float or isinstance(raw, int)):
            return hint(raw)
        if isinstance(raw, str):
            try:
                return hint(raw)
            except ValueError:
                pass
            if hint is int and name.endswith("_bytes"):
                return parse_bytes(name, raw)
    elif hint is Path and isinstance(raw, (str, Path)):
        return Path(raw).expanduser()
    elif hint is str and isinstance(raw, str):
        return raw
    kind = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{name} must be {kind}, not {raw!r}")
