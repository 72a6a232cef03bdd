"""The examples of a section of the docs, run as written against a node: what a new user
pastes, with the docs' address replaced by the node's."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.paths import REPO

DOCS_ADDRESS = "192.168.1.10:7420"  # where the docs' examples send their requests


@dataclass(frozen=True)
class Outputs:
    shell: str  # what the section's `sh` block printed
    python: str  # and its `python` block


def section_blocks(doc: str, heading: str, language: str) -> list[str]:
    """The `language` code blocks of the section under `## heading` of REPO/doc, as written."""
    text = (REPO / doc).read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def run_section(doc: str, heading: str, address: str, token: str, folder: Path) -> Outputs:
    """The section's one `sh` block and one `python` block, each run in `folder` beside the
    api.token file they read (holding `token`); each must exit 0."""
    (folder / "api.token").write_text(token + "\n")
    (curl,) = section_blocks(doc, heading, "sh")
    (python,) = section_blocks(doc, heading, "python")
    ran = []
    for command in (["bash", "-c", curl], [sys.executable, "-c", python]):
        command[-1] = command[-1].replace(DOCS_ADDRESS, address)
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        ran.append(done.stdout)
    return Outputs(*ran)
