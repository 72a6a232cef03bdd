"""How the benchmarks count the decode rate of streams that run at once."""

from __future__ import annotations

import pytest

from harness.streams import TimedStream, concurrent_decode_rate


def _stream(*stamps: float) -> TimedStream:
    return TimedStream(stamps=list(stamps))


@pytest.mark.parametrize(
    ("stamps", "rate"),
    [
        # one stream: chunks after the first over the time between the first and the last
        ([(1.0, 1.5, 2.0, 2.5, 3.0)], 2.0),
        # two in lockstep: two tokens a half second
        ([(1.0, 1.5, 2.0), (1.0, 1.5, 2.0)], 4.0),
        # the second starts late (its prefill): only the window where both decode counts
        ([(0.0, 1.0, 2.0, 3.0, 4.0), (2.0, 3.0, 4.0, 5.0)], 2.0),
        # the first ends early: the window closes with it
        ([(0.0, 1.0, 2.0), (0.0, 1.0, 2.0, 3.0, 4.0)], 2.0),
    ],
)
def test_only_chunks_while_every_stream_decodes_count(
    stamps: list[tuple[float, ...]], rate: float
) -> None:
    assert concurrent_decode_rate([_stream(*s) for s in stamps]) == pytest.approx(rate)


@pytest.mark.parametrize(
    "stamps",
    [
        [],
        [(1.0,)],
        [(0.0, 1.0), (2.0, 3.0)],  # never decoding at the same time
    ],
)
def test_streams_that_never_decode_together_have_no_rate(stamps: list[tuple[float, ...]]) -> None:
    with pytest.raises(RuntimeError):
        concurrent_decode_rate([_stream(*s) for s in stamps])
