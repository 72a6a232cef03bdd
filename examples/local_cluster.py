"""Start three swarm nodes on this machine, ask them a question, stop them: `swarm demo` as a
script. Run with the project's environment: `.venv/bin/python examples/local_cluster.py`."""

import asyncio

from swarm.cli import DEMO_PROMPT, _print_trace, _stream_answer
from swarm.config import load_config
from swarm.demo import run_demo

if __name__ == "__main__":
    runtime = load_config(preset="local").runtime
    asyncio.run(run_demo(runtime, DEMO_PROMPT, 96, _stream_answer, _print_trace))
