"""The systemd unit in examples/: systemd accepts it, it stops the node gracefully (SIGTERM) with
more time than the node's drain, and restarts it when it fails."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.config import Config

UNIT = Path(__file__).resolve().parent.parent / "examples" / "swarm.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def test_the_unit_stops_gracefully_after_the_drain_and_restarts_on_failure() -> None:
    service = _unit()["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > Config.lan().net.drain_timeout_s + 10
    assert service["Restart"] == "on-failure"
    assert service["ExecStart"].split()[:2] == ["/opt/swarm/.venv/bin/swarm", "node"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at this checkout's command
    swarm = str(Path(sys.executable).parent / "swarm")
    unit = tmp_path / "swarm.service"
    unit.write_text(UNIT.read_text().replace("/opt/swarm/.venv/bin/swarm", swarm))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
