"""`swarm pull` and `swarm models` as a user runs them (real processes): a local file or a hub
repository (a local stand-in) stored whole in the cache, listed with its parts and bytes, and
a node on a pulled repository that starts and answers with its hub gone."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from harness.commands import one_line_error
from harness.commands import swarm_command as swarm
from harness.factories import write_sharded_llama
from harness.family_models import SPECS, build_model, write_gguf
from harness.hub_standin import HubStandin
from harness.reference import complete_locally
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.exits import WRONG_START
from swarm.pull import CachedModel, models_table

REPO = "owner/tiny"
RAW_PROMPT = "ab cd ef gh"  # the tiny GGUF has no chat template
TOKENS = 8


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return monkeypatch


def _models(cache: Path) -> list[list[str]]:
    listed = swarm("models", cache=cache)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    return [line.split() for line in rows if not line.startswith("downloads from hubs")]


@pytest.mark.parametrize(
    ("models", "downloads", "lines"),
    [
        ([], 0, ["no models in /c; `swarm pull MODEL` stores one"]),
        (
            [CachedModel(Path("/c/x"), "ab" * 32, "owner/name", 3, 32, 2_500_000)],
            7_000_000,
            [
                "model id              parts        MB  source",
                "abababababababab       3/32       2.5  owner/name",
                "downloads from hubs kept for conversion: 7.0 MB in /c/hub",
            ],
        ),
        (
            [CachedModel(Path("/c/old-c2"), "", "", 0, 0, 1_000_000, "unreadable manifest")],
            0,
            [
                "model id              parts        MB  source",
                "-                         -       1.0  old-c2: unreadable manifest",
            ],
        ),
    ],
)
def test_the_models_table(models: list[CachedModel], downloads: int, lines: list[str]) -> None:
    assert models_table(models, downloads, Path("/c")) == lines


def test_an_unknown_model_is_one_line(tmp_path: Path) -> None:
    one_line_error(swarm("pull", "gpt-17", cache=tmp_path), WRONG_START, "unknown model 'gpt-17'")
    nothing = swarm("pull", str(tmp_path / "nothing.gguf"), cache=tmp_path)
    one_line_error(nothing, WRONG_START, "no such file")


def test_an_empty_cache_says_so(tmp_path: Path) -> None:
    listed = swarm("models", cache=tmp_path / "none")
    assert listed.returncode == 0 and "no models in" in listed.stdout


@pytest.mark.slow
def test_a_local_file_is_converted_whole_and_listed(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    pulled = swarm("pull", str(tiny_gguf), cache=cache)
    assert pulled.returncode == 0, pulled.stderr
    parts = int(re.search(r"all (\d+) parts", pulled.stdout)[1])  # type: ignore[index]
    assert "100%" in pulled.stderr  # the progress bar ran to its end
    ((model_id, held, megabytes, source),) = _models(cache)
    assert source == str(tiny_gguf) and held == f"{parts}/{parts}" and float(megabytes) > 0
    again = swarm("pull", str(tiny_gguf), cache=cache)  # nothing left to do
    assert again.returncode == 0 and model_id in again.stdout


@pytest.mark.slow
def test_a_safetensors_repository_downloads_each_shard_once(
    hub_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = write_sharded_llama(tmp_path)
    shards = sorted(p.name for p in repo.glob("*.safetensors"))
    cache = tmp_path / "cache"
    with HubStandin({REPO: repo}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.endpoint)
        pulled = swarm("pull", REPO, cache=cache)
        assert pulled.returncode == 0, pulled.stderr
        for shard in shards:
            whole = (0, (repo / shard).stat().st_size)
            gets = [(r.start, r.end) for r in hub.log if r.method == "GET" and r.file == shard]
            assert gets.count(whole) == 1, (shard, gets)  # beside its header, read to index
    ((_, held, _, source),) = _models(cache)
    total = held.split("/")[1]
    assert source == REPO and held == f"{total}/{total}"


@pytest.mark.slow
def test_a_node_runs_a_pulled_repository_with_its_hub_gone(
    hub_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = SPECS["llama"]
    path = write_gguf(build_model(spec), spec, tmp_path / "repo" / "tiny-f32.gguf")
    ref = f"{REPO}:tiny-f32.gguf"
    cache = tmp_path / "cache"
    with HubStandin({REPO: path.parent}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.endpoint)
        pulled = swarm("pull", ref, cache=cache)
        assert pulled.returncode == 0, pulled.stderr
    # the stand-in's port now refuses: the node cannot ask the hub for the repository's commit
    runtime = RuntimeConfig(model=ref, cache_dir=cache, dtype="float32", threads=1)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    node = start_node(port, None, tmp_path / "state", runtime, ["--threads", "1"])
    try:
        one_process = RuntimeConfig(model=str(path), cache_dir=tmp_path / "ref", threads=1)
        expected = asyncio.run(complete_locally(one_process, RAW_PROMPT, TOKENS))
        asyncio.run(wait_for_coverage(address, 1, 120.0))
        body = {"prompt": RAW_PROMPT, "max_tokens": TOKENS, "temperature": 0}
        assert asyncio.run(_complete(address, body)) == expected
    finally:
        stop_nodes([node])
    log = (tmp_path / "state" / f"node-{port}.log").read_text()
    assert "running the copy indexed here before" in log
    # in one process, by the id `swarm models` shows
    ((model_id, _, _, _),) = _models(cache)
    run = ("generate", "--model", model_id, "--raw", "--prompt", RAW_PROMPT)
    here = swarm(*run, "--max-tokens", str(TOKENS), "--dtype", "float32", cache=cache)
    assert here.returncode == 0, here.stderr
    assert here.stdout.rstrip("\n") == expected


async def _complete(address: str, body: dict[str, object]) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{address}/v1/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        text: str = (await r.json())["choices"][0]["text"]
        return text
