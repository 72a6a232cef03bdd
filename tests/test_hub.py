"""Hub repositories as model references, against a local stand-in of the hub: parsing, the
index built from headers only (with the identity a node holding the files computes),
resumable and verified downloads, and one clear error for each way the hub can fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from harness.factories import tiny_tokenizer, write_tiny_llama
from harness.hub_standin import HubStandin
from swarm.errors import ModelNotFoundError, TransferError
from swarm.exits import WRONG_START
from swarm.runtime.checkpoint.source import HubRef, hub_ref, own_name, resolve_model
from swarm.runtime.checkpoint.store import ModelStore
from swarm.transfer import hub_files
from swarm.transfer.hub import open_hub
from swarm.transfer.hub_files import HubRepo

REPO = "owner/tiny"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-repo")
    # shards (about one per layer's half) larger than the first read of a header
    model = write_tiny_llama(root / "single", hidden_size=128, intermediate_size=256)
    folder = root / "repo"
    model.save_pretrained(folder, max_shard_size="300KB")
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def hub(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    """The stand-in, as huggingface_hub's endpoint in this process (a node reads HF_ENDPOINT
    when it starts; this process imported huggingface_hub long before)."""
    with HubStandin({REPO: repo}) as standin:
        monkeypatch.setattr(constants, "ENDPOINT", standin.endpoint)
        template = standin.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        yield standin


@pytest.mark.parametrize(
    ("ref", "parsed", "name"),
    [
        ("owner/tiny", HubRef("owner/tiny", "main", None), "tiny"),
        ("o/m@v1.0", HubRef("o/m", "v1.0", None), "m"),
        ("o/m-GGUF:m-Q4_K_M.gguf", HubRef("o/m-GGUF", "main", "m-Q4_K_M.gguf"), "m-Q4_K_M"),
        ("o/m@abc:sub/m.gguf", HubRef("o/m", "abc", "sub/m.gguf"), "m"),
        ("o/m:../x.gguf", None, ""),
        ("a/b/c", None, "c"),
        ("./a", None, "a"),
        ("model.gguf", None, "model"),
        ("smollm2-135m-instruct", None, "smollm2-135m-instruct"),
    ],
)
def test_hub_references(ref: str, parsed: HubRef | None, name: str) -> None:
    assert hub_ref(ref) == parsed
    if parsed is not None:
        assert own_name(ref) == name
        assert str(parsed) == ref


def test_a_local_folder_wins_over_a_repository_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "tiny").mkdir(parents=True)
    assert hub_ref("owner/tiny") is None
    with pytest.raises(ModelNotFoundError, match="the hub"):
        resolve_model("owner/else")  # only a node fetches from the hub


def test_the_index_comes_from_headers_with_the_files_identity(
    hub: HubStandin, repo: Path, tmp_path: Path
) -> None:
    model = open_hub(HubRef(REPO, "main", None), REPO, tmp_path / "cache", 10.0)
    local = ModelStore.open(str(repo), tmp_path / "local")
    assert model.model_id == local.manifest.model_id
    shards = sorted(p.name for p in repo.glob("*.safetensors"))
    assert len(shards) > 2
    for shard in shards:  # one read of the header, nothing more
        ((start, end),) = hub.fetched(REPO, shard)
        assert start == 0 and end < (repo / shard).stat().st_size
    # a second start of the same commit asks the hub for its commit only
    before = len(hub.log)
    again = open_hub(HubRef(REPO, "main", None), REPO, tmp_path / "cache", 10.0)
    assert again.model_id == model.model_id
    assert [r.method for r in hub.log[before:]] == ["INFO"]


def test_a_download_resumes_and_is_checked_against_the_hubs_hash(
    hub: HubStandin, repo: Path, tmp_path: Path
) -> None:
    remote = HubRepo.open(HubRef(REPO, "main", None), 10.0)
    shard = sorted(p.name for p in repo.glob("*.safetensors"))[1]
    data = (repo / shard).read_bytes()
    dest = tmp_path / shard
    dest.with_name(shard + ".partial").write_bytes(data[:1000])  # an interrupted download
    moved: list[int] = []
    remote.download(shard, dest, moved.append)
    assert dest.read_bytes() == data and sum(moved) == len(data)
    assert hub.log[-1].start == 1000  # asked for the rest only
    wrong = tmp_path / "wrong" / shard
    wrong.parent.mkdir()
    wrong.with_name(shard + ".partial").write_bytes(b"x" * 1000)  # bytes of something else
    with pytest.raises(TransferError, match="does not match the hash"):
        remote.download(shard, wrong, moved.append)
    assert not wrong.with_name(shard + ".partial").exists() and not wrong.exists()


def test_missing_files_revisions_and_choices_are_named(
    hub: HubStandin, repo: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(ModelNotFoundError, match=r"^owner/tiny has no file 'x.gguf'; its GGUF"):
        open_hub(HubRef(REPO, "main", "x.gguf"), REPO, cache, 10.0)
    with pytest.raises(ModelNotFoundError, match="no revision 'v9'"):
        open_hub(HubRef(REPO, "v9", None), REPO, cache, 10.0)
    with pytest.raises(ModelNotFoundError, match="no such repository"):
        open_hub(HubRef("owner/other", "main", None), REPO, cache, 10.0)


def test_an_unreachable_hub_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with HubStandin({}) as gone:
        endpoint = gone.endpoint  # a port nobody listens on once it stopped
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    with pytest.raises(TransferError, match=f"cannot reach the hub at {endpoint}"):
        open_hub(HubRef(REPO, "main", None), REPO, tmp_path, 5.0)


@pytest.mark.slow
def test_a_node_on_an_unknown_repository_exits_with_one_line(
    hub: HubStandin, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("HF_HUB_OFFLINE", None)
    args = ["node", "--model", "owner/nothing", "--cache-dir", str(tmp_path), "--port", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "swarm", *args, "--state-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == WRONG_START
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"swarm: error: owner/nothing: no such repository on {hub.endpoint} "
        "(nor a local file or folder)"
    )


def test_byte_ranges_resume_by_piece(
    hub: HubStandin, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_files, "PIECE_BYTES", 4096)
    remote = HubRepo.open(HubRef(REPO, "main", None), 10.0)
    shard = sorted(p.name for p in repo.glob("*.safetensors"))[1]
    data = (repo / shard).read_bytes()
    sparse = tmp_path / shard
    with sparse.open("wb") as f:
        f.truncate(len(data))
    wanted = [(100, 9000), (20000, 20100)]
    remote.fetch_ranges(shard, sparse, wanted, lambda n: None)
    copy = sparse.read_bytes()
    assert all(copy[a:b] == data[a:b] for a, b in wanted)
    assert copy[9000:20000] == bytes(11000)  # nothing else was asked for
    # cut off after the first pieces: the book lists what landed, the rest is asked again
    book = sparse.with_name(shard + ".ranges.json")
    book.write_text(json.dumps([[100, 4196]]))
    before = len(hub.log)
    remote.fetch_ranges(shard, sparse, wanted, lambda n: None)
    asked = [(r.start, r.end) for r in hub.log[before:]]
    assert asked == [(4196, 8292), (8292, 9000), (20000, 20100)]
