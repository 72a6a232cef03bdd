from __future__ import annotations

from collections.abc import Sequence

from swarm.inference.generation import _TextStream

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 6: "\ufffd"}


class PieceDecoder:
    """Stands in for a tokenizer: token id -> fixed text piece."""

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(PIECES[i] for i in ids)


def _stream(ids: list[int], stop: tuple[str, ...]) -> tuple[str, bool]:
    stream = _TextStream(PieceDecoder(), stop)  # type: ignore[arg-type]
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


def test_incomplete_character_is_held_back() -> None:
    stream = _TextStream(PieceDecoder(), ())  # type: ignore[arg-type]
    assert stream.push([1, 6]) == ("Hel", False)
