"""Leaving gracefully (SIGTERM): take no new requests, announce that this node is draining so
the others plan without it and cover its layers first (make-before-break), let the sessions it
holds finish, then leave.

Two kinds of session are in flight on a node. Steps it runs as a hop for other entries can be
handed off: when `net.drain_timeout_s` runs out the node leaves anyway, and their entries
re-route and replay. Requests it is the entry of cannot: their HTTP responses come from this
process, so it waits for them to finish (a second signal stops the node at once)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from swarm.placement import covered_by_others

if TYPE_CHECKING:
    from swarm.node import Node

log = logging.getLogger(__name__)

_POLL_S = 0.1  # seconds between checks of cover and sessions


def hop_sessions(node: Node) -> int:
    """Sessions whose KV caches this node's hop holds."""
    return sum(len(shard.kv.sessions()) for shard in node.serving.all())


async def drain(node: Node) -> None:
    node.service.accepting = False
    me = node.gossiper.local
    node.gossiper.update_record(dataclasses.replace(me, draining=True))
    log.info("leaving: taking no new requests; waiting for cover and sessions in flight")

    def handed_over() -> bool:
        records = node.gossiper.view.routable_members(me.model_id)
        covered = covered_by_others(node.serving.span, records, me.node_id)
        return covered and hop_sessions(node) == 0

    if not await _until(handed_over, node.config.net.drain_timeout_s):
        log.warning(
            "leaving with %d hop sessions in flight; their entries will re-route",
            hop_sessions(node),
        )
    await _until(lambda: node.service.in_flight == 0, None)
    await node.gossiper.leave()  # while the gossip loop still runs, so the news goes out


async def _until(condition: Callable[[], bool], timeout_s: float | None) -> bool:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not condition():
        if deadline is not None and time.monotonic() > deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True
