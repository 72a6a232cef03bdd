"""The swarm's keys, from the node's config: derived from the shared secret, or, without one,
the loopback key, which a node may use only while it listens on loopback."""

from __future__ import annotations

import logging

from swarm.config import LOOPBACK_HOSTS, NodeConfig
from swarm.errors import ConfigError
from swarm.wire import SwarmKeys, load_secret

log = logging.getLogger(__name__)


def swarm_keys(node: NodeConfig) -> SwarmKeys:
    secret = load_secret(node.secret_file) if node.secret_file else None
    if secret is not None:
        return SwarmKeys.derive(secret)
    if node.host not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"binding to {node.host} needs a swarm secret (node.secret_file); "
            "without one a node listens on loopback only. Run `swarm keygen` to make one."
        )
    log.warning("no swarm secret configured: listening on loopback only")
    return SwarmKeys.loopback()
