"""The decode cost model behind a node's announced pace: a call's wall time read as the pace
of one row through one layer, whatever the batch and span the plan gives the node."""

from __future__ import annotations

import pytest

from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import _PROBE_ROWS, SpeedMeter, StepCost, _step_cost, measure_speed

COST = StepCost(step_ms=0.2, layer_ms=0.15, row_ms=0.12)


def test_the_fit_recovers_each_part_of_the_cost() -> None:
    layers = 4
    fitted = _step_cost(
        layers,
        one_layer=COST.expected_ms(1, 1),
        all_layers=COST.expected_ms(layers, 1),
        batched=COST.expected_ms(layers, _PROBE_ROWS),
    )
    assert fitted.step_ms == pytest.approx(COST.step_ms)
    assert fitted.layer_ms == pytest.approx(COST.layer_ms)
    assert fitted.row_ms == pytest.approx(COST.row_ms)


def test_noisy_probes_never_give_a_negative_part() -> None:
    # two layers measured faster than one, a batch faster than one row: timing noise
    fitted = _step_cost(4, one_layer=1.0, all_layers=0.9, batched=0.8)
    assert fitted.step_ms >= 0 and fitted.layer_ms >= 0 and fitted.row_ms >= 0
    assert fitted.pace_ms > 0
    one_layer_probe = _step_cost(1, one_layer=0.5, all_layers=0.5, batched=1.1)
    assert one_layer_probe.step_ms == 0
    assert one_layer_probe.pace_ms == pytest.approx(0.5)


@pytest.mark.parametrize("layers", [1, 3, 15, 30])
@pytest.mark.parametrize("rows", [1, 2, 8])
def test_a_call_reads_the_same_pace_whatever_its_batch_and_span(layers: int, rows: int) -> None:
    idle = COST.expected_ms(layers, rows)
    assert COST.pace_of(layers, rows, idle) == pytest.approx(COST.pace_ms)
    # a machine three times slower reads three times slower, batch or not
    assert COST.pace_of(layers, rows, 3 * idle) == pytest.approx(3 * COST.pace_ms)


def test_the_meter_holds_steady_while_batch_sizes_swing() -> None:
    meter = SpeedMeter(0.1, COST)
    for i in range(50):
        rows, layers = 1 + (i * 5) % 8, 10 + i % 3
        meter.record_decode(layers, rows, COST.expected_ms(layers, rows))
    assert meter.decode_ms == pytest.approx(COST.pace_ms)
    for _ in range(30):  # capped to a third of a core
        meter.record_decode(10, 4, 3 * COST.expected_ms(10, 4))
    assert meter.decode_ms == pytest.approx(3 * COST.pace_ms, rel=0.01)


def test_a_real_model_probe_fits_its_own_calls() -> None:
    """On the embedded model the fitted parts are not negative and a batch of the probe's
    rows costs less per row than one row alone (what batching is for). The per-layer part
    may fit to zero: the embedded model's 576-wide layers stay in the caches, so a row's
    arithmetic is most of what a layer costs (4 rows took 3.5x one row's time on a 2-core
    AVX2 machine, and the fit put it all in the per-row part)."""
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    measured = measure_speed(context, runtime)
    cost = measured.decode
    assert measured.prefill_ms > 0
    assert cost.layer_ms >= 0 and cost.row_ms >= 0 and cost.step_ms >= 0
    assert cost.layer_ms + cost.row_ms > 0
    per_row_batched = cost.expected_ms(4, _PROBE_ROWS) / _PROBE_ROWS
    assert per_row_batched < cost.expected_ms(4, 1)


@pytest.mark.parametrize(
    ("cost", "share"),
    [
        (StepCost(step_ms=0.2, layer_ms=0.0, row_ms=0.3), 1.0),  # rows are all a layer costs
        (StepCost(step_ms=0.2, layer_ms=0.3, row_ms=0.1), 0.25),
        (StepCost(step_ms=0.2, layer_ms=0.3, row_ms=0.0), 0.0),  # a batch costs what a row does
        (StepCost(step_ms=0.2, layer_ms=0.0, row_ms=0.0), 1.0),  # no pace measured: say a row
    ],
)
def test_the_row_share_is_a_further_rows_part_of_a_lone_rows_pace(
    cost: StepCost, share: float
) -> None:
    assert cost.row_share == pytest.approx(share)
    if cost.pace_ms > 0:  # what a batch of b rows costs per layer, from the share
        for rows in (1, 4, 8):
            fixed = cost.expected_ms(1, 0) - cost.step_ms
            assert fixed + rows * cost.row_ms == pytest.approx(
                cost.pace_ms * (1 + (rows - 1) * share)
            )
