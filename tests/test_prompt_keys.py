"""The prompt cache's decisions as pure functions: a block's digest names its whole prefix,
how many kept blocks a prompt starts from, what an entry believes each hop keeps, and how a
shard's cache keeps blocks beside its sessions (sessions always win)."""

from __future__ import annotations

import pytest
import torch

from swarm.errors import PrefixMissingError
from swarm.inference.prompt_keys import (
    HopKey,
    KeptBlocks,
    block_digests,
    keeps_the_turn,
    reusable_blocks,
)
from swarm.runtime.kv_cache import KVCacheManager, KVShape
from swarm.types import LayerSpan, NodeId, SessionId


def test_a_digest_names_every_token_before_the_end_of_its_block() -> None:
    a = block_digests([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, "4:RAW")
    b = block_digests([1, 2, 3, 4, 5, 6, 7, 9, 9], 4, "4:RAW")
    c = block_digests([0, 2, 3, 4, 5, 6, 7, 8], 4, "4:RAW")
    assert len(a) == 2 and len(b) == 2  # whole blocks only
    assert a[0] == b[0] and a[1] != b[1]
    assert a[0] != c[0] and a[1] != c[1]  # a block after another prefix is another block
    assert block_digests([1, 2, 3, 4], 4, "4:F16") != block_digests([1, 2, 3, 4], 4, "4:RAW")
    assert block_digests([1, 2, 3], 4, "4:RAW") == []
    assert all(len(d) == 32 and int(d, 16) >= 0 for d in a)


@pytest.mark.parametrize(
    ("held", "prompt", "size", "expected"),
    [
        (0, 100, 32, 0),
        (2, 100, 32, 2),
        (5, 100, 32, 3),  # a longer kept prefix: the prompt's own whole blocks only
        (3, 96, 32, 2),  # the last token is always computed: its step gives the logits
        (3, 97, 32, 3),
        (1, 1, 32, 0),
    ],
)
def test_reusable_blocks(held: int, prompt: int, size: int, expected: int) -> None:
    assert reusable_blocks(held, prompt, size) == expected


A = HopKey(NodeId("a"), LayerSpan(0, 10))
B = HopKey(NodeId("b"), LayerSpan(10, 20))


def test_an_entry_counts_the_blocks_every_hop_of_a_route_was_sent() -> None:
    kept = KeptBlocks(kept_per_hop=3)
    assert kept.held([A, B], ["x", "y"]) == 0
    kept.sent([A, B], ["x", "y"])
    kept.sent([A], ["z"])
    assert kept.held([A, B], ["x", "y", "z"]) == 2
    assert kept.held([A], ["x", "y", "z"]) == 3
    assert kept.held([A, B], ["y"]) == 1
    # the node on other layers keeps none of these
    assert kept.held([HopKey(NodeId("a"), LayerSpan(0, 12))], ["x"]) == 0
    kept.sent([A], ["w"])  # past its limit a hop's oldest digest is forgotten
    assert kept.held([A], ["x"]) == 0 and kept.held([A], ["y", "z", "w"]) == 3
    kept.forget(NodeId("b"))
    assert kept.held([B], ["x"]) == 0 and kept.held([A], ["y"]) == 1


SHAPE = KVShape((0, 1), kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
PER_TOKEN = SHAPE.bytes_per_token()  # 16 bytes: 2 layers x (key + value) x 2 floats
SPAN = LayerSpan(0, 2)


def _filled(kv: KVCacheManager, session: str, tokens: int, value: float) -> None:
    cache = kv.acquire(SessionId(session), 0, tokens)
    cache.layers = SPAN
    cache.begin_step(0, tokens)
    for layer in (0, 1):
        step = torch.full((1, 1, tokens, 2), value + layer)
        cache.update(step, -step, layer)
    cache.commit()


def test_a_kept_block_starts_a_new_session_with_its_positions() -> None:
    kv = KVCacheManager(SHAPE, 64 * 64 * PER_TOKEN, 60.0)
    _filled(kv, "s", 8, 1.0)
    kv.keep(SessionId("s"), "d0", 0, 4)
    kv.keep(SessionId("s"), "d1", 4, 4)
    kv.close(SessionId("s"))
    cache = kv.adopt(SessionId("t"), ["d0", "d1"], SPAN)
    assert cache.length == 8 and cache.layers == SPAN
    assert torch.equal(cache._keys[1][:, :, :8], torch.full((1, 1, 8, 2), 2.0))
    assert torch.equal(cache._values[0][:, :, :8], torch.full((1, 1, 8, 2), -1.0))
    assert kv.prefixes.counts.adopted == 2 and kv.prefixes.counts.kept == 2
    with pytest.raises(PrefixMissingError, match="1 of them held"):
        kv.adopt(SessionId("u"), ["d0", "gone"], SPAN)
    with pytest.raises(PrefixMissingError):  # kept for other layers is not kept
        kv.adopt(SessionId("u"), ["d0"], LayerSpan(0, 1))
    assert kv.prefixes.counts.missing == 2


def test_sessions_always_win_over_kept_blocks() -> None:
    kv = KVCacheManager(SHAPE, 224 * PER_TOKEN, 60.0)  # room for 224 positions in all
    _filled(kv, "s", 64, 1.0)
    kv.keep(SessionId("s"), "d0", 0, 32)
    kv.keep(SessionId("s"), "d1", 32, 32)
    assert len(kv.prefixes) == 2 and kv.used_bytes == 128 * PER_TOKEN
    # a new session that needs the room evicts the least recently used block first, and no
    # session while blocks are left
    kv.adopt(SessionId("t"), ["d0"], SPAN)  # d0 is now the most recently used
    kv.acquire(SessionId("t"), 32, 64)  # 128 positions of capacity: d1 must go
    assert "s" in kv and ("d0", SPAN) in kv.prefixes and ("d1", SPAN) not in kv.prefixes
    assert kv.used_bytes == 224 * PER_TOKEN
    # a block never evicts a session: where the sessions leave too little room it is not
    # kept, and no older block makes way for it in vain
    kv.keep(SessionId("s"), "d01", 0, 64)
    assert ("d01", SPAN) not in kv.prefixes and ("d0", SPAN) in kv.prefixes
    assert "s" in kv and "t" in kv and kv.prefixes.counts.evicted == 1


@pytest.mark.parametrize(
    ("best_ms", "best_blocks", "kept_ms", "kept_blocks", "expected"),
    [
        (10.0, 0, 12.0, 3, True),  # keeps more, a little slower: the turn stays
        (10.0, 0, 15.0, 3, True),  # at the limit
        (10.0, 0, 16.0, 3, False),  # much slower: the fastest route, computing it all
        (10.0, 3, 9.0, 3, False),  # keeps no more: the fastest
        (10.0, 2, 10.0, 3, True),
    ],
)
def test_a_conversation_keeps_to_the_route_of_its_blocks_unless_it_is_much_slower(
    best_ms: float, best_blocks: int, kept_ms: float, kept_blocks: int, expected: bool
) -> None:
    assert keeps_the_turn(best_ms, best_blocks, kept_ms, kept_blocks) is expected


def test_the_holders_of_a_block_are_the_nodes_it_went_through() -> None:
    kept = KeptBlocks()
    kept.sent([A, B], ["x"])
    kept.sent([A], ["y"])
    assert kept.holders("x") == {NodeId("a"), NodeId("b")} and kept.holders("y") == {NodeId("a")}
    assert kept.holders("z") == set()


def test_a_shard_that_shrinks_keeps_the_blocks_of_the_layers_it_keeps() -> None:
    from swarm.runtime.prefix_blocks import PrefixBlock, PrefixBlocks, carried

    blocks = PrefixBlocks()
    layers = [torch.full((1, 1, 4, 2), float(i)) for i in range(11, 22)]
    blocks.put(("d", LayerSpan(11, 22)), PrefixBlock(tuple(layers), tuple(-t for t in layers)))
    blocks.put(("e", LayerSpan(11, 15)), PrefixBlock(tuple(layers[:4]), tuple(layers[:4])))
    (key, block), *rest = carried(blocks, LayerSpan(11, 19))
    assert key == ("d", LayerSpan(11, 19)) and not rest  # "e" lacks layers 15..18
    assert len(block.keys) == 8 and float(block.keys[-1][0, 0, 0, 0]) == 18.0
    assert float(block.values[0][0, 0, 0, 0]) == -11.0
    # and the entry counts them held by that node on its new span, not on a wider one
    kept = KeptBlocks()
    kept.sent([HopKey(NodeId("n"), LayerSpan(11, 22))], ["d"])
    assert kept.held([HopKey(NodeId("n"), LayerSpan(11, 19))], ["d"]) == 1
    assert kept.held([HopKey(NodeId("n"), LayerSpan(9, 19))], ["d"]) == 0


def test_a_prompts_blocks_are_kept_from_its_first_never_its_later_ones_alone() -> None:
    """Room for two blocks beside the session: its first two are kept, the third is not (it
    would have to push out the ones it follows), and another prompt's old block makes way."""
    kv = KVCacheManager(SHAPE, (128 + 64) * PER_TOKEN, 60.0)
    _filled(kv, "old", 32, 0.0)
    kv.keep(SessionId("old"), "o0", 0, 32)
    kv.close(SessionId("old"))
    _filled(kv, "s", 96, 1.0)  # 128 positions of capacity: 64 left for blocks
    for i, digest in enumerate(["d0", "d1", "d2"]):
        kv.keep(SessionId("s"), digest, 32 * i, 32)
    assert kv.prefixes.held(["d0", "d1", "d2"], SPAN) == 2
    assert ("o0", SPAN) not in kv.prefixes
    # a block that does not follow the session's last kept one is not kept
    kv.keep(SessionId("s"), "d9", 0, 32)
    assert ("d9", SPAN) not in kv.prefixes
    # started from kept blocks, a session keeps the ones after them
    kv.close(SessionId("s"))
    kv.adopt(SessionId("t"), ["d0"], SPAN)
    kv.acquire(SessionId("t"), 32, 32).begin_step(32, 32)
    kv.get(SessionId("t")).commit()
    kv.keep(SessionId("t"), "e1", 32, 32)
    assert kv.prefixes.held(["d0", "e1"], SPAN) == 2
    # the error a hop answers names how many of the asked blocks it holds
    with pytest.raises(PrefixMissingError) as missing:
        kv.adopt(SessionId("u"), ["d0", "e1", "x", "y"], SPAN)
    assert missing.value.held == 2


def test_a_prompts_blocks_make_way_from_its_last_one_back() -> None:
    """A session that needs room drops kept blocks least recently used first, but never one
    that a kept block follows: what is left of a prompt is a prefix of it."""
    kv = KVCacheManager(SHAPE, 256 * PER_TOKEN, 60.0)
    _filled(kv, "s", 96, 1.0)
    for i, digest in enumerate(["d0", "d1", "d2"]):
        kv.keep(SessionId("s"), digest, 32 * i, 32)
    kv.close(SessionId("s"))
    kv.acquire(SessionId("t"), 0, 192)  # 192 of 256 positions: one block must go
    # d0 is the least recently used, but d1 follows it, and d2 follows d1
    assert kv.prefixes.held(["d0", "d1", "d2"], SPAN) == 2
    assert ("d2", SPAN) not in kv.prefixes
