"""What a node reports about itself and about each request, as typed records, and their JSON.

GET /status, the dashboard, `swarm status`, the demo, /metrics and the tests all read these
records; the node builds them. `to_json` and `from_json` are the only places their JSON is
written or read, so renaming a field is a type error, not a silently empty dashboard column.
A reader ignores keys it does not know and gives missing ones their default, so nodes and
clients of neighbouring versions can mix: a new field needs a default. A field that /metrics
shows declares its metric in its type (`Annotated[int, counter(...)]`, `swarm.measures`), and
the HTTP layer reads /metrics off the records, so a counter is declared once, here. The node's
load is one record per side (`EntryLoad`, `HopLoad`, `PromptCacheLoad`), each made whole by the
side that counts it and carried as it is. (Longer than our files usually are: it is the whole
of what /status says, kept in one file so it reads as one document.)"""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

from swarm.errors import StatusFormatError
from swarm.measures import counter, gauge

Span = tuple[int, int]  # layers [start, end)
T = TypeVar("T")


@dataclass(frozen=True)
class MemberRow:
    """One member as this node's membership view sees it."""

    id: str
    address: str
    state: str  # alive, suspect, dead, left
    span: Span | None
    ms_per_layer_decode: float  # measured, per layer per token
    ms_per_layer_prefill: float
    layer_memory_bytes: int
    bytes_per_layer: int
    max_layers: int
    device: str
    dtype: str
    active_sessions: int
    queue_depth: int  # compute jobs waiting on that member
    kv_free_bytes: int
    gpu_temperature_c: float | None
    gpu_utilization: float | None
    gpu_memory_used_bytes: int | None
    gpu_memory_total_bytes: int | None
    model_id: str
    rtt_ms: float | None = None  # measured from this node; None when never measured
    # False when this node's messages to it fail (it cannot be reached from here); None for
    # the node itself
    reachable: bool | None = None
    # seconds since its last gossip message arrived here; None when none has (or this node)
    heard_s_ago: float | None = None
    # an outbound fast link from this node to it is open now; None for the node itself
    fast_link: bool | None = None
    model: str = ""  # the name clients call its model by; "" from a node that gives none
    gpu_power_w: float | None = None  # watts its GPU draws; None without readings
    # why its GPU runs slowed ("hot (91 C)", "power cap"); None where nothing says so
    gpu_throttling: str | None = None
    # ms a decode step costs it beyond its layers, as it measured (0: it does not say)
    ms_per_step_fixed: float = 0.0


# families that fields of several records share, each field giving its label's value
_BATCHED_CALLS = counter(
    "swarm_batched_calls",
    "Batched compute calls: the hop's decoder layers, the entry's head",
    "part",
)
_BATCHED_STEPS = counter(
    "swarm_batched_steps", "Steps those calls carried (steps / calls is the mean batch)", "part"
)
_BLOCK_EVENTS = counter(
    "swarm_prompt_cache_block_events",
    "Prompt blocks this node's layers: started sessions from (adopted), were asked for "
    "and no longer held (missing), kept, dropped for room (evicted)",
    "event",
)


@dataclass(frozen=True)
class EntryLoad:
    """The requests this node is the entry of, and what its head did for them since start
    (continuous batching: batched head calls and the steps they carried; steps / calls is the
    mean batch). The entry side's `status()` makes it."""

    sessions: Annotated[
        int, gauge("swarm_entry_sessions", "Requests in flight with this node as entry")
    ] = 0
    batches: Annotated[int, _BATCHED_CALLS.at("head")] = 0
    batched_steps: Annotated[int, _BATCHED_STEPS.at("head")] = 0
    # of those steps, the ones sampled on the compute thread where their result arrived
    thread_steps: Annotated[
        int,
        counter(
            "swarm_head_thread_steps",
            "Head steps the compute thread sampled where their result arrived",
        ),
    ] = 0
    # of those, the ones whose next step the compute thread sent at once, before the event
    # loop streamed their token
    sent_ahead: Annotated[
        int,
        counter(
            "swarm_steps_sent_ahead",
            "Decode steps the compute thread sent as soon as the head sampled their token",
        ),
    ] = 0
    # spot-checks (swarm/inference/spot_checks.py): steps run again through other holders
    spot_checks: Annotated[
        int,
        counter("swarm_spot_checks", "Steps this entry ran again on other holders and compared"),
    ] = 0
    spot_check_mismatches: Annotated[
        int,
        counter("swarm_spot_check_mismatches", "Spot-checks whose result differed in its bits"),
    ] = 0
    spot_checks_undecided: Annotated[
        int,
        counter("swarm_spot_checks_undecided", "Spot-check mismatches no third route could decide"),
    ] = 0


@dataclass(frozen=True)
class HopLoad:
    """This node's layers: the sessions whose KV caches they hold now (bytes), and since start
    the batched decode calls and the steps they carried. The hop side's `status()` makes it."""

    kv_sessions: Annotated[
        int, gauge("swarm_kv_sessions", "Sessions whose KV caches this node holds")
    ] = 0
    kv_used_bytes: Annotated[
        int, gauge("swarm_kv_cache_used_bytes", "KV cache bytes in use on this node")
    ] = 0
    kv_budget_bytes: Annotated[
        int, gauge("swarm_kv_cache_budget_bytes", "KV cache byte budget of this node")
    ] = 0
    batches: Annotated[int, _BATCHED_CALLS.at("hop")] = 0
    batched_steps: Annotated[int, _BATCHED_STEPS.at("hop")] = 0
    # of those steps, the ones run on the compute thread where their fast-link frame arrived
    thread_steps: Annotated[
        int,
        counter(
            "swarm_hop_thread_steps",
            "Decode steps the compute thread ran where their fast-link frame arrived",
        ),
    ] = 0
    # reloads of its span from its store that entries asked for, their spot-checks having
    # found it computing wrong bits (swarm/inference/reload.py): carried out, and refused
    reloads: Annotated[
        int,
        counter(
            "swarm_layer_reloads",
            "Reloads of this node's layers from its store that entries' spot-checks asked for",
        ),
    ] = 0
    reloads_refused: Annotated[
        int,
        counter(
            "swarm_layer_reloads_refused",
            "Reload requests refused: from a non-member, or too soon after the last reload",
        ),
    ] = 0


@dataclass(frozen=True)
class PromptCacheLoad:
    """The prompt blocks this node's layers keep (swarm.runtime.prefix_blocks): held now, and
    since start the blocks sessions started from, the asks for blocks no longer held, the
    blocks kept and those dropped for room. The hop side's `status()` makes it."""

    blocks: Annotated[
        int,
        gauge(
            "swarm_prompt_cache_blocks", "Prompt blocks this node's layers keep for later prompts"
        ),
    ] = 0
    nbytes: Annotated[
        int,
        gauge(
            "swarm_prompt_cache_bytes",
            "Bytes of the kept prompt blocks (within the KV cache budget)",
        ),
    ] = 0
    adopted: Annotated[int, _BLOCK_EVENTS.at("adopted")] = 0
    missing: Annotated[int, _BLOCK_EVENTS.at("missing")] = 0
    kept: Annotated[int, _BLOCK_EVENTS.at("kept")] = 0
    evicted: Annotated[int, _BLOCK_EVENTS.at("evicted")] = 0


@dataclass(frozen=True)
class NodeLoad:
    """This node's own load, read now (not from gossip): each side's record as it made it."""

    rss_bytes: int = 0  # resident memory (/metrics has it as process_resident_memory_bytes)
    entry: EntryLoad = EntryLoad()
    hop: HopLoad = HopLoad()
    prompt_cache: PromptCacheLoad = PromptCacheLoad()


@dataclass(frozen=True)
class NodeInfo:
    id: str
    address: str
    span: Span | None
    load: NodeLoad = NodeLoad()
    # False when peers take this node's messages but none of theirs arrive: they cannot reach
    # the address it advertises
    reachable_by_peers: bool = True
    # why it advertises `address`: "--advertise", "the bound address", "the route to the
    # bootstrap peer HOST:PORT", "the default route", "the only interface"
    address_because: str = ""
    fast_port: int | None = None  # where it takes fast links; None without them
    # the clock its frames are sealed and checked with, read as the status was made (unix
    # seconds), and the window around it a frame's clock must fall in
    clock_unix: float | None = None
    clock_window_s: float | None = None
    clock_ahead_s: float | None = None  # how far ahead of that clock a frame may be sealed
    protocol_version: int | None = None  # of the frames it seals


@dataclass(frozen=True)
class RefusedPeer:
    """What this node refused from one peer address for one reason, since it started."""

    peer: str  # the address the refused bytes came from (an IP; their content is untrusted)
    # bad_frame, wrong_key, clock, version, replay, misaddressed, bad_hello, body_too_large,
    # ... (swarm.errors.FrameRefusal, and the HTTP server's own)
    reason: str
    what: str  # what was refused: "gossip", "a link", "a request", ...
    count: int
    last_s_ago: float  # seconds since the last one


@dataclass(frozen=True)
class ModelInfo:
    name: str
    id: str
    layers: Annotated[int, gauge("swarm_layers", "Decoder layers of the model")]


@dataclass(frozen=True)
class ModelDetails:
    """The model an entry serves, as the API describes it to clients (Ollama's /api/tags,
    /api/show and /api/ps)."""

    name: str  # what clients name in `model`
    family: str  # the transformers model type, e.g. "llama"
    format: str  # "gguf" or "safetensors": what the checkpoint was read from
    parameters: int  # weights of the whole model, every part counted once
    size_bytes: int  # the whole model's tensors as stored (quantized blocks packed)
    quantization: str  # the GGUF block type of most weights ("Q4_1"), else the float dtype
    digest: str  # sha256 of the source checkpoint's bytes: the model id peers agree on
    context_tokens: int  # prompt and answer together
    layers: int
    hidden_size: int
    chat_template: str  # the template's source; empty where the model has none
    loaded_unix: float  # when this node opened the model


@dataclass(frozen=True)
class SessionRow:
    """A request this node is the entry of, and the nodes of its route."""

    id: str
    route: tuple[str, ...]


@dataclass(frozen=True)
class Coverage:
    """Which layers the live members serve now."""

    complete: bool
    missing: tuple[Span, ...]
    covered_layers: Annotated[int, gauge("swarm_layers_covered", "Layers some live member serves")]
    bottleneck_tokens_per_s: float
    # the layers whose capacity is the bottleneck, and the members serving them: the machines
    # that limit the swarm's throughput now (empty while layers are missing)
    limiting_layers: Span | None = None
    limited_by: tuple[str, ...] = ()
    # ms one token takes through the fastest route, each hop's fixed cost included (None
    # while layers are missing): with the bottleneck, what a number of streams get
    # (`placement.predicted_rate`)
    route_ms: float | None = None


@dataclass(frozen=True)
class Copy:
    """A member that holds a whole model: a request for the model may run there from end to
    end, so copies share the requests (`model_routing.spread`)."""

    address: str  # its API address, "host:port"
    ms_per_token: float  # ms one token takes through every layer there, as it measured
    load: int  # its sessions generating and its compute jobs waiting, as it gossips them
    here: bool = False  # the node that reports it


@dataclass(frozen=True)
class ServedModel:
    """One model the swarm serves: what /v1/models, /api/tags and `swarm status` list, and
    where a request for it goes."""

    name: str  # what clients name in `model`
    model_id: str  # the checkpoint's content id (an 8+ digit prefix of it is accepted too)
    layers: int
    coverage: Coverage  # among the live members serving it, and only them
    aliases: tuple[str, ...] = ()  # other names it answers to
    # the API addresses ("host:port") of its alive members that take requests, least loaded
    # first: where a node that does not serve it sends a request for it
    entries: tuple[str, ...] = ()
    here: bool = False  # the node that reports it serves it
    # its alive members that hold it whole and take requests, least loaded first
    copies: tuple[Copy, ...] = ()


@dataclass(frozen=True)
class PlanReport:
    """The placement this node computed last, for every member."""

    spans: dict[str, Span | None]
    bottleneck_tokens_per_s: float
    hops: int | None  # fewest hops of any route through it; None when layers are missing
    decision: str = ""  # what this node decided on it last, and why ("stay: cooling_down ...")


@dataclass(frozen=True)
class TransferReport:
    """Weights this node fetches from its peers (all zero on a node that has the file)."""

    # a fetch is running now
    active: Annotated[bool, gauge("swarm_transfer_active", "1 while weights are being fetched")] = (
        False
    )
    parts_done: int = 0  # of the parts asked for since the node started
    parts_total: int = 0
    # received and verified
    bytes_done: Annotated[
        int, gauge("swarm_transfer_received_bytes", "Weight bytes fetched from peers")
    ] = 0
    # of the parts whose digests are known
    bytes_total: Annotated[
        int, gauge("swarm_transfer_wanted_bytes", "Weight bytes asked of peers")
    ] = 0
    # over the running (or the last) fetch
    bytes_per_s: Annotated[
        float, gauge("swarm_transfer_bytes_per_second", "Rate of the current fetch")
    ] = 0.0
    current: str | None = None  # the part being fetched
    sources: tuple[str, ...] = ()  # peers the current part comes from
    # peers that sent data failing its digest, avoided since (/metrics counts them)
    bad_peers: Annotated[
        tuple[str, ...], gauge("swarm_transfer_bad_peers", "Peers caught sending corrupt weights")
    ] = ()
    # this node sent to peers
    sent_bytes: Annotated[int, gauge("swarm_transfer_sent_bytes", "Weight bytes sent to peers")] = 0


@dataclass(frozen=True)
class ApiReport:
    in_flight: int
    max_concurrent_requests: int
    token_required: bool
    queued: int = 0  # requests waiting for a slot now
    queue_size: int = 0  # how many may wait (api.queue_size)


@dataclass(frozen=True)
class RouteHop:
    node: str
    address: str
    layers: Span


@dataclass(frozen=True)
class HopTimes:
    """Where one step's time went at one hop, in milliseconds, in the order it was spent
    (every stamp on the hop's own clock; nothing compares clocks across machines). The hops
    write it into the step's frame (`swarm.wire.messages` encodes it); a trace reports the
    last step's."""

    node: str
    queue: float  # the step waited for the compute thread
    compute: float  # running the span
    wire: float  # authenticating and decoding the frame in
    dispatch: float = 0.0  # from decoded to the hop server taking the step (inbox, task)
    resume: float = 0.0  # from the compute thread finishing to the event loop resuming
    # encoding and writing this session's previous outgoing frame: a frame's own timings are
    # written before it is sent, so this one reports the last step's send
    send: float = 0.0


@dataclass(frozen=True)
class FailoverReport:
    """One re-route of a request."""

    failed: str | None
    reason: str
    detected_at: float  # unix time the entry gave up on the step
    waited_ms: float  # from sending the step to giving up on it
    replay_ms: float | None  # the replay prefill on the new route, once done
    replay_tokens: int


@dataclass(frozen=True)
class HopTimeline:
    """Milliseconds one hop spent on a session's decode steps, summed over them, in the order
    a step spends them (each on the hop's own clock)."""

    node: str
    steps: int
    wire_in: float  # authenticating and decoding the frame
    dispatch: float  # from decoded to the hop server taking the step
    queue: float  # waiting for the compute thread (and the batch it joined)
    compute: float  # running the span (a batch's whole call)
    resume: float  # from the compute thread finishing to the event loop resuming
    send: float  # encoding and writing the frame on (reported one step late)


@dataclass(frozen=True)
class Timeline:
    """Where a session's decode steps spent their time, summed over them (milliseconds). The
    entry's `step` spans everything from sending a step to its result resuming the pipeline;
    what the hops do not account for of it is the links: kernels, sockets, wake-ups."""

    steps: int
    step: float
    send: float  # the entry encoding and writing each step to the first hop
    resume: float  # from the entry decoding the result to the pipeline resuming
    head: float  # head, sampling and the next token's embedding, as the generation waited
    hops: tuple[HopTimeline, ...] = ()


@dataclass(frozen=True)
class RequestTrace:
    """Where a request went and what its last step cost, hop by hop; its re-routes; where
    its decode steps' time went."""

    route: tuple[RouteHop, ...]
    hop_timings_ms: tuple[HopTimes, ...] = ()
    failovers: tuple[FailoverReport, ...] = ()
    timeline: Timeline | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One generation this entry answered, however it ended."""

    id: str
    # "chat", "completions", "ollama_chat", "ollama_generate" or "anthropic_messages"
    endpoint: str
    stream: bool
    outcome: str  # a finish reason ("stop", "length"), "error" or "disconnected"
    started_unix: float
    duration_ms: float
    first_token_ms: float | None
    prompt_tokens: int
    completion_tokens: int
    route: tuple[RouteHop, ...] = ()
    hop_timings_ms: tuple[HopTimes, ...] = ()  # the last step's
    cached_tokens: int = 0  # prompt tokens that came from blocks the hops kept


@dataclass(frozen=True)
class SpotCheckReport:
    """Members this entry's spot-checks (swarm/inference/spot_checks.py) found computing
    wrong results; the counts of checks are in `EntryLoad`."""

    # convictions since start, by member id
    wrong_results: Annotated[
        dict[str, int],
        counter("swarm_wrong_results", "Members spot-checks found computing wrong results", "node"),
    ] = dataclasses.field(default_factory=dict)
    # members left out of this entry's routes now, until they reload their layers or start
    # again
    left_out: tuple[str, ...] = ()
    # members asked to reload their layers from their stores (once per conviction)
    reloads_asked: Annotated[
        dict[str, int],
        counter(
            "swarm_reloads_asked",
            "Members this entry asked to reload their layers after convicting them",
            "node",
        ),
    ] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class SpeculationReport:
    """Speculative decoding at this entry since it started: verify steps, the tokens they
    drafted and the drafts the target accepted (accepted / verify_steps: the mean accepted
    length, each verify step also yielding one token of the target's own)."""

    verify_steps: Annotated[
        int, counter("swarm_speculative_verify_steps", "Verify steps of drafted tokens")
    ] = 0
    drafted: Annotated[
        int, counter("swarm_speculative_drafted_tokens", "Tokens drafted for verify steps")
    ] = 0
    accepted: Annotated[
        int, counter("swarm_speculative_accepted_tokens", "Drafted tokens the target accepted")
    ] = 0
    # drafts accepted per verify step
    mean_accepted: Annotated[
        float,
        gauge(
            "swarm_speculative_mean_accepted",
            "Drafted tokens accepted per verify step, since start",
        ),
    ] = 0.0
    # verify steps whose drafts were dropped unverified (a hop failed during the step and
    # the session was replayed, or a peer ran it as a plain step); nothing else is lost
    unverified: int = 0
    draft_model: str = ""  # the entry's draft model, as configured; "" = lookups only
    # of `drafted`, the tokens the draft model made
    model_drafted: Annotated[
        int,
        counter(
            "swarm_speculative_model_drafted_tokens",
            "Tokens the draft model drafted for verify steps",
        ),
    ] = 0
    # of `accepted`, the draft model's
    model_accepted: Annotated[
        int,
        counter(
            "swarm_speculative_model_accepted_tokens",
            "The draft model's tokens the target accepted",
        ),
    ] = 0


@dataclass(frozen=True)
class NodeStatus:
    """GET /status."""

    node: NodeInfo
    model: ModelInfo
    members: tuple[MemberRow, ...]
    coverage: Coverage
    sessions: tuple[SessionRow, ...] = ()
    plan: PlanReport | None = None
    api: ApiReport | None = None  # added by the HTTP layer
    recent_requests: tuple[RequestRecord, ...] = ()  # newest first
    # what this node refused since it started, by reason (bad frames, caps, timeouts)
    refusals: Annotated[
        dict[str, int],
        counter("swarm_refusals", "Requests, connections and frames refused, by reason", "reason"),
    ] = dataclasses.field(default_factory=dict)
    # the same by peer address and reason (the most recent pairs), most recent first
    refused_from: tuple[RefusedPeer, ...] = ()
    # per peer id: this node's clock minus the peer's, as its frames tell, in ms (transit
    # time included); frames beyond the wire's clock window (30 s) are refused
    clock_skew_ms: Annotated[
        dict[str, float],
        gauge(
            "swarm_peer_clock_skew_seconds",
            "This node's clock minus a peer's, as its frames tell (transit included)",
            "node",
            scale=1e-3,
        ),
    ] = dataclasses.field(default_factory=dict)
    transfer: TransferReport = TransferReport()
    speculation: SpeculationReport = SpeculationReport()
    spot_checks: SpotCheckReport = SpotCheckReport()
    models: tuple[ServedModel, ...] = ()  # every model the swarm serves, this node's first


def to_json(record: Any) -> Any:
    """A record (or a tuple, dict or scalar of them) as plain JSON values."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_json(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (tuple, list)):
        return [to_json(v) for v in record]
    if isinstance(record, dict):
        return {str(k): to_json(v) for k, v in record.items()}
    return record


def from_json(kind: type[T], data: Any) -> T:
    """The record of type `kind` that `data` (parsed JSON) describes; StatusFormatError names
    the first field that does not fit."""
    value: T = _read(kind, data, kind.__name__)
    return value


def _read(kind: Any, data: Any, where: str) -> Any:
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        options = get_args(kind)
        if data is None and type(None) in options:
            return None
        for option in options:
            if option is not type(None):
                return _read(option, data, where)
    if dataclasses.is_dataclass(kind):
        return _read_record(kind, data, where)
    if origin is tuple:
        return _read_tuple(kind, data, where)
    if origin is dict:
        if not isinstance(data, dict):
            raise StatusFormatError(f"{where} must be an object")
        _, value_kind = get_args(kind)
        return {str(k): _read(value_kind, v, f"{where}.{k}") for k, v in data.items()}
    if kind is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if kind in (int, str, bool) and type(data) is kind:
        return data
    raise StatusFormatError(f"{where} must be {getattr(kind, '__name__', kind)}, not {data!r}")


def _read_record(kind: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise StatusFormatError(f"{where} must be an object")
    hints = get_type_hints(kind, vars(sys.modules[kind.__module__]))
    values = {}
    for f in dataclasses.fields(kind):
        if f.name in data:
            values[f.name] = _read(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise StatusFormatError(f"{where}.{f.name} is missing")
    return kind(**values)


def _read_tuple(kind: Any, data: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(data, list):
        raise StatusFormatError(f"{where} must be an array")
    args = get_args(kind)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
    if len(data) != len(args):
        raise StatusFormatError(f"{where} must have {len(args)} items")
    pairs = enumerate(zip(args, data, strict=True))
    return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
