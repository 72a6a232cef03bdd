from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from swarm.inference.text_stream import TextStream

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 6: "\ufffd"}


class PieceDecoder:
    """Stands in for a tokenizer: token id -> fixed text piece."""

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(PIECES[i] for i in ids)


def _stream(ids: list[int], stop: tuple[str, ...]) -> tuple[str, bool]:
    stream = TextStream(PieceDecoder(), stop)
    out = ""
    for n in range(1, len(ids) + 1):
        delta, stopped = stream.push(ids[:n])
        out += delta
        if stopped:
            return out, True
    return out + stream.flush(), False


def test_text_streams_in_order() -> None:
    assert _stream([1, 2, 3, 4, 5], ()) == ("Hello world!", False)


def test_stop_string_ends_before_it() -> None:
    assert _stream([1, 2, 3, 4, 5], (" wo",)) == ("Hello", True)


def test_stop_string_across_tokens_is_held_back_then_found() -> None:
    assert _stream([1, 2, 3, 4, 5], ("rld",)) == ("Hello wo", True)


def test_partial_stop_prefix_is_released_when_it_does_not_complete() -> None:
    assert _stream([1, 2, 3, 4, 5], ("lo!",)) == ("Hello world!", False)


@pytest.mark.parametrize(
    ("stop", "hit"),
    [
        ((" wo", "ld"), " wo"),  # the first in the text, whatever the list's order
        (("ld", " wo"), " wo"),
        (("o w", "o wo"), "o w"),  # the same place: the first listed
        (("o wo", "o w"), "o wo"),
        (("xyz",), None),
    ],
)
def test_the_stop_string_that_ended_the_text_is_named(
    stop: tuple[str, ...], hit: str | None
) -> None:
    stream = TextStream(PieceDecoder(), stop)
    for n in range(1, 6):
        if stream.push([1, 2, 3, 4, 5][:n])[1]:
            break
    assert stream.hit == hit


def test_incomplete_character_is_held_back() -> None:
    stream = TextStream(PieceDecoder(), ())
    assert stream.push([1, 6]) == ("Hel", False)


class HfDecoder:
    """A real byte-level BPE tokenizer (as most models use), trained here on a few lines."""

    def __init__(self) -> None:
        from tokenizers import ByteLevelBPETokenizer

        core = ByteLevelBPETokenizer()
        core.train_from_iterator([TEXT] * 4, vocab_size=300, min_frequency=1, show_progress=False)
        self.core = core

    def encode(self, text: str) -> list[int]:
        return list(self.core.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.core.decode(list(ids)))


TEXT = "Grüße aus Zürich 🐝🐝 — swarm nodes pass activations; ça marche, 東京も. " * 3


def test_streamed_text_is_the_whole_decode_with_a_real_tokenizer() -> None:
    decoder = HfDecoder()
    ids = decoder.encode(TEXT)
    stream = TextStream(decoder, ())
    out = "".join(stream.push(ids[:n])[0] for n in range(1, len(ids) + 1)) + stream.flush()
    assert out == decoder.decode(ids) == TEXT
    stopped = TextStream(decoder, ("Zürich 🐝",))
    out = ""
    for n in range(1, len(ids) + 1):
        delta, hit = stopped.push(ids[:n])
        out += delta
        if hit:
            break
    assert hit and out == "Grüße aus "


def test_a_token_costs_the_same_however_long_the_output() -> None:
    """32k characters of output with long stop strings that never match: the last tokens cost
    about what the first ones did (the whole text is neither re-decoded nor re-searched)."""
    stops = ("x" * 255 + "y", "w1 " * 80 + "!")
    stream = TextStream(PieceDecoder(), stops)
    ids = [1, 2, 3, 4] * 4000  # "Hello world" again and again: 44k characters
    timings = []
    for n in range(1, len(ids) + 1):
        started = time.perf_counter()
        stream.push(ids[:n])
        timings.append(time.perf_counter() - started)
    first, last = sorted(timings[100:1100])[500], sorted(timings[-1000:])[500]
    assert last < max(4 * first, 0.0005), (first, last)
