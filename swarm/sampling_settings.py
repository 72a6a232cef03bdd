"""A request's sampling settings: one record and one table of bounds, checked once where a
request enters (the HTTP API's body, the command line's flags) and trusted everywhere after
(the service, the sampler, the generation loop). The bounds are OpenAI's where it has them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarm.errors import SamplingError


@dataclass(frozen=True)
class Bound:
    low: float  # written as the messages quote it: 0 for a count, 0.0 for a float
    high: float  # math.inf: no upper bound

    def describe(self) -> str:
        return f"[{self.low}, {self.high}]"


# The one definition of what each setting may be; the API's error messages quote it.
BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, math.inf),
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0),  # 0 keeps only the most likely token
    "top_k": Bound(0, math.inf),
    "min_p": Bound(0.0, 1.0),
    "repetition_penalty": Bound(0.01, 10.0),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "seed": Bound(-(2**63), 2**64 - 1),
}
LOGIT_BIAS = Bound(-100, 100)
TOP_LOGPROBS_MAX = 20  # alternatives per token that a request may ask for


@dataclass(frozen=True)
class SamplingSettings:
    """How one request chooses its tokens. Constructing one checks every field against BOUNDS
    and raises SamplingError naming the field, so an instance is always valid."""

    max_tokens: int | None = None  # new tokens at most; None: up to the model's context
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0  # nucleus mass kept
    min_p: float = 0.0  # tokens below min_p times the best one's probability are dropped
    repetition_penalty: float = 1.0  # 1 = none; >1 discourages tokens already in the sequence
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from each token generated so far
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per time a token was generated so far
    seed: int | None = None
    stop: tuple[str, ...] = ()  # generation ends before the first of these strings
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    logprobs: int | None = None  # None: none; n: each token's and its n likeliest alternatives'
    grammar: str | None = None  # llguidance grammar the answer must match; None: free text
    # draft tokens and verify them in one step where the node does (speculation.enabled);
    # the text is the same either way
    speculate: bool = True
    # start from the prompt blocks the route's hops kept from earlier prompts that began
    # with the same tokens (runtime.prompt_cache); the text is the same either way
    cache_prompt: bool = True

    def __post_init__(self) -> None:
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if value is not None:
                check_bound(name, value, bound)
        if any(not LOGIT_BIAS.low <= bias <= LOGIT_BIAS.high for _, bias in self.logit_bias):
            raise SamplingError(
                f"logit_bias values must be in {LOGIT_BIAS.describe()}", "logit_bias"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= TOP_LOGPROBS_MAX:
            raise SamplingError(f"logprobs must be in [0, {TOP_LOGPROBS_MAX}]", "logprobs")
        if any(not s for s in self.stop):
            raise SamplingError("stop strings must not be empty", "stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_bound(name: str, value: float, bound: Bound) -> None:
    """SamplingError naming `name` unless `value` is a finite number within `bound`."""
    if not (math.isfinite(value) and bound.low <= value <= bound.high):
        raise SamplingError(f"{name} must be in {bound.describe()}", name)
