"""Two models in one swarm, over real node processes: two nodes split the embedded model, a
third serves a tiny seeded GGUF model, all three behind one API token. Whichever node a
request enters, naming either model by name, alias or id, its answer is what one process
generates; requests to both models run at once; an unknown name is a 404 listing both, in
each API's shape; and once the embedded model loses a node, a request for it is a 503 naming
the model and the layers no one serves, at every node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.browser import Browser, chromium_or_skip
from harness.cluster import Cluster, start_cluster
from harness.gguf_fixture import LLAMA_TINY, fixture_path
from harness.paths import FIXTURES
from harness.polling import until
from harness.reference import generate_locally
from harness.streams import follow
from swarm import cli
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports
from swarm.runtime.execution.model import ModelContext
from swarm.schema import NodeStatus, ServedModel
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKEN = "models-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SMOL = "smollm2-135m-instruct"
PROMPT = "Name three colours of the rainbow."
NEW_TOKENS = 12


@dataclass
class Swarm:
    smol: Cluster  # two nodes that split the embedded model
    tiny: Cluster  # one node serving the tiny model, joined to them
    tiny_name: str
    texts: dict[str, str]  # model name -> what one process answers PROMPT

    @property
    def addresses(self) -> list[str]:
        return [*self.smol.addresses, *self.tiny.addresses]


@pytest.fixture(scope="module")
def swarm(smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("models")
    token_file = root / "api.token"
    token_file.write_text(TOKEN)
    tiny_gguf = fixture_path(LLAMA_TINY, FIXTURES)
    tiny_runtime = RuntimeConfig(model=str(tiny_gguf), cache_dir=root / "cache", threads=1)
    texts = {
        SMOL: _reference(smol_packed),
        tiny_gguf.stem: _reference(tiny_runtime),
    }
    context = ModelContext.open(smol_packed, progress=False)
    memory = str(16 * bytes_per_layer(context))  # 30 layers need both nodes
    flags = ["--threads", "1", "--api-token-file", str(token_file)]
    smol_flags = [[*flags, "--layer-memory-bytes", memory]] * 2
    smol_ports, tiny_ports = (lambda p: (p[:2], p[2:]))(free_ports(3))
    smol = asyncio.run(
        start_cluster(smol_packed, root / "smol", smol_flags, 2, token=TOKEN, ports=smol_ports)
    )
    try:
        tiny = asyncio.run(
            start_cluster(
                tiny_runtime,
                root / "tiny",
                [flags],
                1,
                token=TOKEN,
                ports=tiny_ports,
                join=smol.addresses[0],
            )
        )
    except BaseException:
        smol.stop()
        raise
    try:
        yield Swarm(smol, tiny, tiny_gguf.stem, texts)
    finally:
        tiny.stop()
        smol.stop()


def _reference(runtime: RuntimeConfig) -> str:
    return asyncio.run(generate_locally(runtime, [PROMPT], NEW_TOKENS))[0].text


async def _models(address: str) -> list[ServedModel]:
    status: NodeStatus = await SwarmClient(address, token=TOKEN).status()
    return list(status.models)


async def _both_served(swarm: Swarm) -> None:
    """Until every node lists both models, each complete."""

    async def listed() -> bool:
        for address in swarm.addresses:
            models = await _models(address)
            if len(models) != 2 or not all(m.coverage.complete for m in models):
                return False
        return True

    await until(listed, "every node listing both models, each complete", 120, every_s=0.2)


def _chat(model: str, **more: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        **more,
    }


async def _answer(http: aiohttp.ClientSession, address: str, model: str) -> str:
    url = f"http://{address}/v1/chat/completions"
    async with http.post(url, json=_chat(model), headers=AUTH) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
    text: str = body["choices"][0]["message"]["content"]
    return text


async def test_every_node_answers_for_every_model_as_one_process_does(swarm: Swarm) -> None:
    await _both_served(swarm)
    async with aiohttp.ClientSession() as http:
        for address in swarm.addresses:
            for name, text in swarm.texts.items():
                assert await _answer(http, address, name) == text, (address, name)


async def test_a_model_is_named_by_alias_or_id_and_streams_through_any_node(swarm: Swarm) -> None:
    await _both_served(swarm)
    models = {m.name: m for m in await _models(swarm.tiny.addresses[0])}
    smol_id, tiny_id = models[SMOL].model_id, models[swarm.tiny_name].model_id
    async with aiohttp.ClientSession() as http:
        # by id, and by an id's prefix, entering at a node of the other model
        assert await _answer(http, swarm.tiny.addresses[0], smol_id) == swarm.texts[SMOL]
        tiny_text = swarm.texts[swarm.tiny_name]
        assert await _answer(http, swarm.smol.addresses[1], tiny_id[:10]) == tiny_text
        # Ollama's name for it, through Ollama's route
        url = f"http://{swarm.smol.addresses[0]}/api/chat"
        body = {**_chat(f"{swarm.tiny_name}:latest"), "stream": False}
        body["options"] = {"temperature": 0, "num_predict": NEW_TOKENS}
        del body["max_tokens"], body["temperature"]
        async with http.post(url, json=body, headers=AUTH) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["message"]["content"] == tiny_text
    # streamed, through the node that sends it on
    client = SwarmClient(swarm.smol.addresses[0], token=TOKEN)
    stream = await follow(client.chat({**_chat(swarm.tiny_name), "stream": True}))
    assert "".join(stream.text) == tiny_text


async def test_requests_to_both_models_run_at_once(swarm: Swarm) -> None:
    await _both_served(swarm)
    asked = [
        (address, name) for address in swarm.addresses for name in swarm.texts
    ]  # 6 requests, each model entering at each node
    async with aiohttp.ClientSession() as http:
        answers = await asyncio.gather(*(_answer(http, a, name) for a, name in asked))
    for (address, name), text in zip(asked, answers, strict=True):
        assert text == swarm.texts[name], (address, name)


async def test_an_unknown_model_is_a_404_listing_the_models_in_each_apis_shape(
    swarm: Swarm,
) -> None:
    await _both_served(swarm)
    both = (repr(SMOL), repr(swarm.tiny_name))
    address = swarm.tiny.addresses[0]
    async with aiohttp.ClientSession() as http:
        url = f"http://{address}/v1/chat/completions"
        async with http.post(url, json=_chat("gpt-4o"), headers=AUTH) as r:
            assert r.status == 404
            error = (await r.json())["error"]
        assert error["code"] == "model_not_found" and all(n in error["message"] for n in both)
        url = f"http://{address}/v1/messages"
        async with http.post(url, json=_chat("claude-sonnet-4-5"), headers=AUTH) as r:
            assert r.status == 404
            anthropic = await r.json()
        assert anthropic["error"]["type"] == "not_found_error"
        assert all(n in anthropic["error"]["message"] for n in both)
        url = f"http://{address}/api/generate"
        async with http.post(url, json={"model": "llama3", "prompt": "hi"}, headers=AUTH) as r:
            assert r.status == 404
            message = (await r.json())["error"]
        assert f"'{swarm.tiny_name}:latest'" in message and f"'{SMOL}:latest'" in message
        # the listings name both, with their coverage
        async with http.get(f"http://{address}/v1/models", headers=AUTH) as r:
            listed = (await r.json())["data"]
        assert [m["id"] for m in listed] == [swarm.tiny_name, SMOL]
        assert all(m["coverage"]["complete"] for m in listed)
        async with http.get(f"http://{address}/api/tags", headers=AUTH) as r:
            tags = [m["name"] for m in (await r.json())["models"]]
        assert tags == [f"{swarm.tiny_name}:latest", f"{SMOL}:latest"]
        smol_id = next(m["model_id"] for m in listed if m["id"] == SMOL)
        async with http.get(f"http://{address}/v1/models/{smol_id[:8]}", headers=AUTH) as r:
            assert (await r.json())["id"] == SMOL
        # the token is the entry's to check, before anything is sent on
        async with http.post(url, json={"model": SMOL, "prompt": "hi"}) as r:
            assert r.status == 401


def test_status_lists_each_model_and_the_model_of_each_member(
    swarm: Swarm, capsys: pytest.CaptureFixture[str]
) -> None:
    status = asyncio.run(SwarmClient(swarm.tiny.addresses[0], token=TOKEN).status())
    assert [m.name for m in status.models] == [swarm.tiny_name, SMOL]
    assert [m.here for m in status.models] == [True, False]
    assert sorted(m.model for m in status.members) == sorted([SMOL, SMOL, swarm.tiny_name])
    cli.print_status(status)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"model {swarm.tiny_name} (3 layers, id ")
    assert printed[0].endswith(", served here); complete")
    assert printed[1].startswith(f"model {SMOL} (30 layers, id ") and "complete" in printed[1]
    rows = [line for line in printed if line.startswith(tuple(m.id for m in status.members))]
    assert sorted(row.split()[2] for row in rows) == sorted([SMOL, SMOL, swarm.tiny_name])


async def test_the_dashboard_lists_both_models_and_maps_only_its_own(
    swarm: Swarm, tmp_path: Path
) -> None:
    await _both_served(swarm)
    browser = chromium_or_skip()
    async with Browser(browser, tmp_path / "profile") as page:
        await page.open(f"http://{swarm.tiny.addresses[0]}/#token={TOKEN}")
        rows = await page.wait_for(
            "[...document.querySelectorAll('#models tr.model')].map(r => r.textContent)"
            ".filter(t => t.includes('complete')).length === 2"
            " && [...document.querySelectorAll('#models tr.model')].map(r => r.dataset.model)"
        )
        assert rows == [swarm.tiny_name, SMOL]
        # the layer map is this node's model's: its one member, not the other model's two
        assert await page.evaluate("document.querySelectorAll('tr.layer-row').length") == 1
        members = await page.evaluate(
            "[...document.querySelectorAll('#members tr.member')]"
            ".map(r => r.children[2].textContent)"
        )
        assert sorted(members) == sorted([SMOL, SMOL, swarm.tiny_name])


async def test_a_model_missing_layers_is_a_503_naming_them_at_every_node(swarm: Swarm) -> None:
    """Runs last: it stops one of the embedded model's two nodes, and the other holds half
    of its layers only."""
    await _both_served(swarm)
    swarm.smol.terminate(1)
    alive = [swarm.smol.addresses[0], *swarm.tiny.addresses]

    async def refused() -> bool:
        async with aiohttp.ClientSession() as http:
            for address in alive:
                url = f"http://{address}/v1/chat/completions"
                async with http.post(url, json=_chat(SMOL), headers=AUTH) as r:
                    if r.status != 503:
                        return False
                    message = (await r.json())["error"]["message"]
                if f"cannot serve model {SMOL!r} now: no live peer serves layers " not in message:
                    return False
        return True

    await until(refused, "a 503 naming the embedded model's missing layers", 60, every_s=0.5)
    async with aiohttp.ClientSession() as http:
        # the other model is unaffected
        tiny_text = swarm.texts[swarm.tiny_name]
        assert await _answer(http, swarm.smol.addresses[0], swarm.tiny_name) == tiny_text
