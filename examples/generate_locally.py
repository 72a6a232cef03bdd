"""The runtime as a library: the whole model in this process, split into three shards that
hand hidden states to each other as network hops would. Prints a greedy answer."""

import asyncio

from swarm.config import RuntimeConfig
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.sampling_settings import SamplingSettings


async def main() -> None:
    local = await load_local(RuntimeConfig(), split="0:10,10:20,20:30")
    try:
        ids = local.entry.encode_chat([{"role": "user", "content": "Name three planets."}])
        async for event in generate(
            local.entry, local.pipeline, local.compute, ids, SamplingSettings(max_tokens=48)
        ):
            if isinstance(event, Chunk):
                print(event.text, end="", flush=True)
        print()
    finally:
        local.compute.close()


if __name__ == "__main__":
    asyncio.run(main())
