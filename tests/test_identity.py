"""A node's id per port, kept in its state folder, and whether it ran before: only a node that
did refuses frames its earlier run may have taken."""

from __future__ import annotations

from pathlib import Path

from swarm.identity import node_id, ran_before


def test_an_id_is_kept_per_port_and_a_second_start_ran_before(tmp_path: Path) -> None:
    assert not ran_before(tmp_path, 7420)
    first = node_id(tmp_path, 7420)
    assert ran_before(tmp_path, 7420) and not ran_before(tmp_path, 7430)
    assert node_id(tmp_path, 7420) == first != node_id(tmp_path, 7430)


def test_an_ephemeral_port_gets_a_new_id_each_run(tmp_path: Path) -> None:
    assert node_id(tmp_path, 0) != node_id(tmp_path, 0)
    assert not ran_before(tmp_path, 0)
