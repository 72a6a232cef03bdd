"""Pure decisions about one GPU: how many of a span's layers it holds, and whether its
readings say it runs slowed (too hot, or clocks held down by nvml's throttle reasons)."""

from __future__ import annotations

from swarm.types import Health

# a GPU at or above this temperature reads hot: consumer cards start to lower their clocks
# around 83-87 C, data-centre cards around 85-90 C
HOT_C = 85.0

# nvml's clock throttle reasons (nvmlClocksThrottleReason*) that mean the clocks are held
# below what the work asks for; idle, application clocks, sync boost and display clocks do not
THROTTLE_REASONS = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake",
}


def device_layers(
    layers: int, layer_bytes: int, kv_bytes_per_layer: int, cap_bytes: int, reserve_bytes: int
) -> int:
    """How many of a span's `layers` (the first ones) a device holds: each takes its weights
    (`layer_bytes` as held there) and its share of the KV cache, within `cap_bytes` less a
    prefill's activations (`reserve_bytes`), which the device needs once, whatever it holds."""
    if layers <= 0:
        return 0
    room = cap_bytes - reserve_bytes
    per_layer = layer_bytes + kv_bytes_per_layer
    if room <= 0 or per_layer <= 0:
        return 0 if room <= 0 else layers
    return min(layers, room // per_layer)


def throttling(health: Health, hot_c: float = HOT_C) -> str | None:
    """Why a GPU with these readings runs slowed ("hot (91 C)", "power cap"), None where
    nothing says so or there is no GPU."""
    why = []
    if health.gpu_temperature_c is not None and health.gpu_temperature_c >= hot_c:
        why.append(f"hot ({health.gpu_temperature_c:.0f} C)")
    reasons = health.gpu_throttle_reasons or 0
    why += [name for bit, name in THROTTLE_REASONS.items() if reasons & bit]
    return ", ".join(why) or None
