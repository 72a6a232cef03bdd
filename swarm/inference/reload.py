"""A reload of this node's span at an entry's request. An entry whose spot-check found this
node's layers computing wrong bits asks for it (`ReloadLayers`); the node re-reads the span
from its store with every part checked against the hash recorded when it was stored (a part
that fails is discarded and never loaded: fetched again from peers, or, where this node has
the model file, stored again from it), builds fresh blocks (none of those in memory, which
may be what went bad), serves them in place of the shard it served, and announces one more
reload in its record, which lets the entry take it back into its routes
(`spot_checks.lifted`). Whether it reloads is `spot_checks.reload_refusal`'s rule."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from swarm.config import Config
from swarm.errors import ModelError
from swarm.inference.spot_checks import reload_refusal
from swarm.rebalancing.loop import RebalancerParts
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.execution.shard import Shard
from swarm.transfer.supply import peer_addresses
from swarm.types import LayerSpan, NodeId
from swarm.wire import ReloadLayers

log = logging.getLogger(__name__)


class Reloader:
    def __init__(
        self, config: Config, parts: RebalancerParts, clock: Callable[[], float] = time.monotonic
    ) -> None:
        # a reload reads what the store holds: a test's flipped byte (runtime.test_flip_byte)
        # was made in memory at the first load, and a reload cures it as it would bad memory
        self._runtime = dataclasses.replace(config.runtime, test_flip_byte="")
        self._every_s = config.net.spot_check_reload_every_s
        self._parts = parts
        self._clock = clock
        self._reloaded_at: dict[LayerSpan, float] = {}  # span -> when it was last reloaded
        self.done = 0  # reloads carried out since start
        self.refused = 0  # requests refused (a stranger's, or too soon after the last)

    async def asked(self, sender: NodeId, message: ReloadLayers) -> None:
        """`sender`'s request (authenticated by its frame): reload, unless refused."""
        parts = self._parts
        member = any(r.node_id == sender for r in parts.membership.standing())
        span, now = parts.serving.span, self._clock()
        why = reload_refusal(member, span, self._reloaded_at, now, self._every_s)
        if why is not None or span is None:
            self.refused += 1
            log.warning("not reloading this node's layers at %s's request: %s", sender, why)
            return
        self._reloaded_at[span] = now  # a second request while this one runs is refused
        async with parts.swapping:  # a move in progress finishes first
            span = parts.serving.span
            if span is None:
                return
            try:
                found = await self._verified(span)
                shard = await parts.compute.run(Shard.load, parts.context, span, self._runtime)
            except ModelError as e:
                log.error("cannot reload layers %s: %s; serving the loaded ones on", span, e)
                return
            await parts.compute.run(parts.serving.move_to, shard, self._clock(), finish=False)
        self.done += 1
        me = parts.membership.local
        parts.membership.publish(dataclasses.replace(me, reloads=me.reloads + 1))
        log.warning(
            "member %s found layers %s computing wrong bits (session %s, position %d): %s; "
            "reloaded them from the store into fresh blocks",
            sender,
            span,
            message.session,
            message.position,
            found,
        )

    async def _verified(self, span: LayerSpan) -> str:
        """`verified_span` for this node: parts fetched again from the members serving
        them, those serving the span first."""
        parts = self._parts
        fetcher, membership = parts.fetcher, parts.membership

        async def from_peers(names: Sequence[str]) -> None:
            if fetcher is None:
                raise ModelError("no peer to fetch it from")
            peers = peer_addresses(membership.routable(), membership.local.node_id, span)
            await fetcher.ensure(names, peers)

        return await verified_span(parts.context.store, span, from_peers)


async def verified_span(
    store: ModelStore, span: LayerSpan, fetch: Callable[[Sequence[str]], Awaitable[None]]
) -> str:
    """Check the span's stored parts against the hashes recorded when they were stored
    (reading each once, off the event loop and the compute thread); a part that fails is
    discarded, so it is never loaded, and brought again: stored again from the model file
    at its load where this node has the file, else fetched now (`fetch`: from peers, each
    chunk checked against the part's digest). What it found, for the log; ModelError when a
    part cannot be had again."""
    names = [layer_part(i) for i in span]
    changed = await asyncio.to_thread(store.discard_changed, names)
    if not changed:
        return f"all {len(names)} stored parts matched their recorded hashes"
    failed = f"{', '.join(changed)} did not match its recorded hash: discarded"
    if store.has_checkpoint:
        return f"{failed}, stored again from the model file"
    await fetch(changed)
    return f"{failed}, fetched again from a peer"
