"""Placement plans for a few home-lab setups, and routes through them.

Pure computation on made-up member records; no model, no network.

    python -m bench.placement_sim
"""

from __future__ import annotations

from swarm.config import PlacementConfig
from swarm.placement import Plan, node_speed, optimal_plan, plan, predicted_rate
from swarm.routing import NoRouteError, RouteQuery, find_route
from swarm.types import Capacity, LayerSpan, MemberRecord, ModelId, NodeId

GIB = 1 << 30
LAYER = 400 * 1024 * 1024  # bytes per decoder layer, roughly an 8B model in bf16


def machine(
    name: str, memory_gib: float, ms: float, span: LayerSpan | None = None, fixed_ms: float = 0.0
) -> MemberRecord:
    capacity = Capacity(
        "cuda:0", "bfloat16", int(memory_gib * GIB), LAYER, ms / 8, ms, ms_per_step_fixed=fixed_ms
    )
    return MemberRecord(NodeId(name), f"{name}.lan:7000", 1, ModelId("m"), 32, capacity, span)


SETUPS: dict[str, list[MemberRecord]] = {
    "gaming PC, laptop, old workstation": [
        machine("gaming-pc", 10, 0.4),
        machine("laptop", 6, 1.2),
        machine("workstation", 48, 6.0),
    ],
    "two equal GPUs that each hold the model": [
        machine("gpu-a", 16, 0.5),
        machine("gpu-b", 16, 0.5),
    ],
    "one fast card, three slow small ones": [
        machine("fast", 8, 0.3),
        machine("slow-1", 4, 1.0),
        machine("slow-2", 4, 1.0),
        machine("slow-3", 4, 1.0),
    ],
    "a fast node for 20 layers, two slow ones, each step's fixed cost 3x on the slow": [
        machine("fast", 8, 0.13, fixed_ms=1.5),
        machine("slow-1", 8, 0.39, fixed_ms=4.5),
        machine("slow-2", 8, 0.39, fixed_ms=4.5),
    ],
    "the same without fixed costs": [
        machine("fast", 8, 0.13),
        machine("slow-1", 8, 0.39),
        machine("slow-2", 8, 0.39),
    ],
    "not enough memory": [machine("a", 4, 1.0), machine("b", 4, 1.0)],
    "a newcomer joins a running split": [
        machine("a", 8, 1.0, LayerSpan(0, 16)),
        machine("b", 8, 1.0, LayerSpan(16, 32)),
        machine("c", 16, 1.0),
    ],
}


def show(title: str, result: Plan, records: list[MemberRecord]) -> None:
    one = predicted_rate(result.bottleneck, result.latency_ms, 1)
    print(
        f"  {title}: {result.bottleneck:.1f} tok/s ({one:.1f} for one stream), hops "
        f"{result.hops}, missing {', '.join(map(str, result.missing)) or '-'}"
    )
    for record in records:
        span = result.span_of(record.node_id)
        print(
            f"    {record.node_id:<12} {node_speed(record):7.0f} layer-tok/s "
            f"holds {record.capacity.max_layers():2d}  ->  {span or '-'}"
        )


def main() -> None:
    for name, records in SETUPS.items():
        print(name)
        show("optimal", optimal_plan(records, 32), records)
        chosen = plan(records, 32, PlacementConfig())
        show("plan (keeps current spans within 15%)", chosen, records)
        served = [
            MemberRecord(**{**r.__dict__, "span": chosen.span_of(r.node_id)}) for r in records
        ]
        try:
            route = find_route(served, RouteQuery(32))
            hops = " -> ".join(f"{h.node_id}[{h.span}]" for h in route.hops)
            print(f"  route: {hops}  ({route.cost_ms:.1f} ms/token)\n")
        except NoRouteError as error:
            print(f"  no route: {error}\n")


if __name__ == "__main__":
    main()
