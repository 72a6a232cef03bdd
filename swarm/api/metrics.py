"""GET /metrics through prometheus-client. Each node has its own registry (several nodes may
share a test process), never the library's global one. Counters and histograms are fed as
requests finish; gauges (KV cache, members by gossip state, coverage, GPU readings) are read
from the node's status at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector

from swarm.schema import MemberRow, NodeLoad, NodeStatus, RequestRecord, TransferReport

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format every Prometheus scrapes
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_HOP_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_MEMBER_GAUGES: tuple[tuple[str, str, Callable[[MemberRow], float | None]], ...] = (
    (
        "swarm_member_ms_per_layer",
        "Announced ms per layer per token",
        lambda m: m.ms_per_layer_decode,
    ),
    (
        "swarm_member_active_sessions",
        "Sessions a member holds caches for",
        lambda m: m.active_sessions,
    ),
    ("swarm_gpu_temperature_celsius", "GPU temperature", lambda m: m.gpu_temperature_c),
    ("swarm_gpu_memory_used_bytes", "GPU memory in use", lambda m: m.gpu_memory_used_bytes),
    ("swarm_gpu_memory_total_bytes", "GPU memory in all", lambda m: m.gpu_memory_total_bytes),
)
_LOAD_GAUGES: tuple[tuple[str, str, Callable[[NodeLoad], int]], ...] = (
    ("swarm_kv_cache_used_bytes", "KV cache bytes in use on this node", lambda n: n.kv_used_bytes),
    (
        "swarm_kv_cache_budget_bytes",
        "KV cache byte budget of this node",
        lambda n: n.kv_budget_bytes,
    ),
    ("swarm_kv_sessions", "Sessions whose KV caches this node holds", lambda n: n.kv_sessions),
    (
        "swarm_prompt_cache_blocks",
        "Prompt blocks this node's layers keep for later prompts",
        lambda n: n.prompt_cache_blocks,
    ),
    (
        "swarm_prompt_cache_bytes",
        "Bytes of the kept prompt blocks (within the KV cache budget)",
        lambda n: n.prompt_cache_bytes,
    ),
    (
        "swarm_entry_sessions",
        "Requests in flight with this node as entry",
        lambda n: n.sessions_in_flight,
    ),
)
_TRANSFER_GAUGES: tuple[tuple[str, str, Callable[[TransferReport], float]], ...] = (
    ("swarm_transfer_received_bytes", "Weight bytes fetched from peers", lambda t: t.bytes_done),
    ("swarm_transfer_wanted_bytes", "Weight bytes asked of peers", lambda t: t.bytes_total),
    ("swarm_transfer_sent_bytes", "Weight bytes sent to peers", lambda t: t.sent_bytes),
    ("swarm_transfer_active", "1 while weights are being fetched", lambda t: float(t.active)),
    ("swarm_transfer_bytes_per_second", "Rate of the current fetch", lambda t: t.bytes_per_s),
    (
        "swarm_transfer_bad_peers",
        "Peers caught sending corrupt weights",
        lambda t: len(t.bad_peers),
    ),
)
_STATES = ("alive", "suspect", "dead", "left")


class ApiMetrics:
    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "swarm_http_requests", "API requests answered", ["route", "status"], registry=r
        )
        self.tokens = Counter("swarm_tokens", "Tokens of finished requests", ["kind"], registry=r)
        self.duration = Histogram(
            "swarm_request_duration_seconds",
            "Generation time from request to last token",
            ["endpoint"],
            buckets=_SECONDS,
            registry=r,
        )
        self.first_token = Histogram(
            "swarm_time_to_first_token_seconds",
            "Time from request to the first token",
            buckets=_SECONDS,
            registry=r,
        )
        self.hop = Histogram(
            "swarm_hop_latency_seconds",
            "Per-hop time of a request's last step, by phase (queue, compute, wire)",
            ["node", "phase"],
            buckets=_HOP_SECONDS,
            registry=r,
        )
        self.queued = Gauge(
            "swarm_requests_queued", "Requests waiting for a slot at this entry", registry=r
        )
        self.in_flight = Gauge(
            "swarm_requests_in_flight", "Generations running at this entry", registry=r
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends
        r.register(_StatusCollector(status))

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def observe(self, record: RequestRecord) -> None:
        self.tokens.labels("prompt").inc(record.prompt_tokens)
        self.tokens.labels("completion").inc(record.completion_tokens)
        self.tokens.labels("cached_prompt").inc(record.cached_tokens)
        self.duration.labels(record.endpoint).observe(record.duration_ms / 1000)
        if record.first_token_ms is not None:
            self.first_token.observe(record.first_token_ms / 1000)
        for t in record.hop_timings_ms:
            for phase, ms in (("queue", t.queue), ("compute", t.compute), ("wire", t.wire)):
                self.hop.labels(t.node, phase).observe(ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StatusCollector:
    """Gauges read from the node's status when Prometheus scrapes."""

    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        for name, doc, read in _LOAD_GAUGES:
            yield GaugeMetricFamily(name, doc, value=read(status.node.load))
        for name, doc, of_transfer in _TRANSFER_GAUGES:
            yield GaugeMetricFamily(name, doc, value=of_transfer(status.transfer))
        states = GaugeMetricFamily("swarm_members", "Members by gossip state", labels=["state"])
        for state in _STATES:
            states.add_metric([state], sum(m.state == state for m in status.members))
        yield states
        yield GaugeMetricFamily(
            "swarm_layers_covered",
            "Layers some live member serves",
            status.coverage.covered_layers,
        )
        yield GaugeMetricFamily("swarm_layers", "Decoder layers of the model", status.model.layers)
        load = status.node.load
        batches = CounterMetricFamily(
            "swarm_batched_calls",
            "Batched compute calls: the hop's decoder layers, the entry's head",
            labels=["part"],
        )
        steps = CounterMetricFamily(
            "swarm_batched_steps",
            "Steps those calls carried (steps / calls is the mean batch)",
            labels=["part"],
        )
        for part, calls, carried in (
            ("hop", load.hop_batches, load.hop_batched_steps),
            ("head", load.head_batches, load.head_batched_steps),
        ):
            batches.add_metric([part], calls)
            steps.add_metric([part], carried)
        yield batches
        yield steps
        yield CounterMetricFamily(
            "swarm_hop_thread_steps",
            "Decode steps the compute thread ran where their fast-link frame arrived",
            value=load.hop_thread_steps,
        )
        yield CounterMetricFamily(
            "swarm_head_thread_steps",
            "Head steps the compute thread sampled where their result arrived",
            value=load.head_thread_steps,
        )
        yield CounterMetricFamily(
            "swarm_steps_sent_ahead",
            "Decode steps the compute thread sent as soon as the head sampled their token",
            value=load.steps_sent_ahead,
        )
        blocks = CounterMetricFamily(
            "swarm_prompt_cache_block_events",
            "Prompt blocks this node's layers: started sessions from (adopted), were asked for "
            "and no longer held (missing), kept, dropped for room (evicted)",
            labels=["event"],
        )
        for event, count in (
            ("adopted", load.prompt_cache_adopted),
            ("missing", load.prompt_cache_missing),
            ("kept", load.prompt_cache_kept),
            ("evicted", load.prompt_cache_evicted),
        ):
            blocks.add_metric([event], count)
        yield blocks
        drafts = status.speculation
        yield CounterMetricFamily(
            "swarm_speculative_verify_steps", "Verify steps of drafted tokens", drafts.verify_steps
        )
        yield CounterMetricFamily(
            "swarm_speculative_drafted_tokens", "Tokens drafted for verify steps", drafts.drafted
        )
        yield CounterMetricFamily(
            "swarm_speculative_accepted_tokens",
            "Drafted tokens the target accepted",
            drafts.accepted,
        )
        yield CounterMetricFamily(
            "swarm_speculative_model_drafted_tokens",
            "Tokens the draft model drafted for verify steps",
            drafts.model_drafted,
        )
        yield CounterMetricFamily(
            "swarm_speculative_model_accepted_tokens",
            "The draft model's tokens the target accepted",
            drafts.model_accepted,
        )
        yield GaugeMetricFamily(
            "swarm_speculative_mean_accepted",
            "Drafted tokens accepted per verify step, since start",
            drafts.mean_accepted,
        )
        refused = CounterMetricFamily(
            "swarm_refusals",
            "Requests, connections and frames refused, by reason",
            labels=["reason"],
        )
        for reason, count in status.refusals.items():
            refused.add_metric([reason], count)
        yield refused
        skew = GaugeMetricFamily(
            "swarm_peer_clock_skew_seconds",
            "This node's clock minus a peer's, as its frames tell (transit included)",
            labels=["node"],
        )
        for node, ms in status.clock_skew_ms.items():
            skew.add_metric([node], ms / 1000)
        yield skew
        for name, doc, member_value in _MEMBER_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            for m in status.members:
                value = member_value(m)
                if value is not None:
                    family.add_metric([m.id], float(value))
            yield family
