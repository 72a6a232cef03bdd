"""GET /metrics through prometheus-client. Each node has its own registry (several nodes may
share a test process), never the library's global one. Counters and histograms are fed as
requests finish; what the node's status records declare (`swarm.measures`: its load, the
transfer, speculation, refusals) and the members' readings are read from its status at scrape
time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector

from swarm.measures import Family, families
from swarm.schema import MemberRow, NodeStatus, RequestRecord

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
    ("swarm_gpu_utilization_ratio", "GPU busy, 0..1", lambda m: m.gpu_utilization),
    ("swarm_gpu_power_watts", "GPU power draw", lambda m: m.gpu_power_w),
    (
        "swarm_gpu_throttling",
        "1 where the GPU reads hot or nvml says its clocks are held down",
        lambda m: None if m.gpu_temperature_c is None else float(m.gpu_throttling is not None),
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
    """Read from the node's status when Prometheus scrapes: every metric its records declare
    (`swarm.measures`), and the members' gossip readings, one gauge per member."""

    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        for family in families(status):
            yield _exposed(family)
        states = GaugeMetricFamily("swarm_members", "Members by gossip state", labels=["state"])
        for state in _STATES:
            states.add_metric([state], sum(m.state == state for m in status.members))
        yield states
        for name, doc, member_value in _MEMBER_GAUGES:
            gauges = GaugeMetricFamily(name, doc, labels=["node"])
            for m in status.members:
                value = member_value(m)
                if value is not None:
                    gauges.add_metric([m.id], float(value))
            yield gauges


def _exposed(family: Family) -> Metric:
    """A family as prometheus-client writes it (a counter's samples get `_total`)."""
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    labels = [] if family.label is None else [family.label]
    metric = kind(family.name, family.help, labels=labels)
    for label, value in family.samples:
        metric.add_metric([] if label is None else [label], value)
    return metric
