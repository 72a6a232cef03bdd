"""Leaving gracefully (SIGTERM): take no new requests, announce that this node is draining so
the others plan without it and cover its layers first (make-before-break), let the sessions it
holds finish, then leave. Whatever is still in flight when `net.drain_timeout_s` runs out is
handed off by failover: the entries re-route and replay."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from swarm.placement import covered_by_others

if TYPE_CHECKING:
    from swarm.node import Node

log = logging.getLogger(__name__)

_POLL_S = 0.1  # seconds between checks of cover and sessions


def sessions_in_flight(node: Node) -> int:
    """Requests this node is the entry of, plus sessions its hop holds."""
    held = sum(len(shard.kv.sessions()) for shard in node.serving.all())
    return len(node.pipeline.traces) + held


async def drain(node: Node) -> None:
    await _wait_until_drained(node)
    await node.gossiper.leave()  # while the gossip loop still runs, so the news goes out


async def _wait_until_drained(node: Node) -> None:
    node.service.accepting = False
    me = node.gossiper.local
    node.gossiper.update_record(dataclasses.replace(me, draining=True))
    log.info("leaving: taking no new requests; waiting for cover and sessions in flight")
    deadline = time.monotonic() + node.config.net.drain_timeout_s
    while time.monotonic() < deadline:
        records = node.gossiper.view.routable_members(me.model_id)
        covered = covered_by_others(node.serving.span, records, me.node_id)
        if covered and sessions_in_flight(node) == 0:
            log.info("leaving: layers covered elsewhere and no session in flight")
            return
        await asyncio.sleep(_POLL_S)
    log.warning(
        "leaving after %.0f s with %d sessions in flight; their entries will re-route",
        node.config.net.drain_timeout_s,
        sessions_in_flight(node),
    )
