"""Gossip updates: what one node tells another about a member, as plain frozen dataclasses.

Each update names a member, an incarnation and a state. They order as a lattice: a higher
incarnation wins, and at equal incarnation alive < suspect < dead < left. Dead and left are
final for their incarnation; only the member itself leaves that state, by announcing itself
alive at a higher incarnation (a refutation). The wire layer gives these `to_wire`/`from_wire`.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.types import MemberRecord, MemberState, NodeId

# Precedence at equal incarnation; a higher rank overrides a lower one.
STATE_RANK: dict[MemberState, int] = {
    MemberState.ALIVE: 0,
    MemberState.SUSPECT: 1,
    MemberState.DEAD: 2,
    MemberState.LEFT: 3,
}


@dataclass(frozen=True)
class Alive:
    """A member is alive, with everything it says about itself."""

    record: MemberRecord

    @property
    def node_id(self) -> NodeId:
        return self.record.node_id

    @property
    def incarnation(self) -> int:
        return self.record.incarnation

    @property
    def state(self) -> MemberState:
        return MemberState.ALIVE


@dataclass(frozen=True)
class Suspect:
    """`from_node` missed a probe of `node_id` at `incarnation`; it dies unless it refutes."""

    node_id: NodeId
    incarnation: int
    from_node: NodeId

    @property
    def state(self) -> MemberState:
        return MemberState.SUSPECT


@dataclass(frozen=True)
class Dead:
    """`from_node` declared `node_id` dead at `incarnation` (its suspicion timed out)."""

    node_id: NodeId
    incarnation: int
    from_node: NodeId

    @property
    def state(self) -> MemberState:
        return MemberState.DEAD


@dataclass(frozen=True)
class Left:
    """The member itself announced a graceful leave at `incarnation`."""

    node_id: NodeId
    incarnation: int

    @property
    def state(self) -> MemberState:
        return MemberState.LEFT


Update = Alive | Suspect | Dead | Left


def update_key(update: Update) -> tuple[int, int]:
    """Where an update sits in the lattice: (incarnation, state rank)."""
    return (update.incarnation, STATE_RANK[update.state])


def state_update(
    node_id: NodeId, state: MemberState, incarnation: int, from_node: NodeId
) -> Suspect | Dead | Left:
    """The record-less update that says `node_id` is in a non-alive `state`."""
    if state is MemberState.SUSPECT:
        return Suspect(node_id, incarnation, from_node)
    if state is MemberState.DEAD:
        return Dead(node_id, incarnation, from_node)
    if state is MemberState.LEFT:
        return Left(node_id, incarnation)
    raise ValueError("an alive update carries a record; build Alive(record) instead")
