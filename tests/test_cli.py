"""The `swarm` command as a user runs it: a real process, its stdout, stderr and exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import one_line_error, swarm_command
from harness.factories import write_tiny_bytes_llama
from swarm.config import RuntimeConfig
from swarm.exits import WRONG_START
from swarm.runtime.execution.devices import cap_holding
from swarm.runtime.execution.model import ModelContext


def _one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    one_line_error(result, WRONG_START, *fragments)


def test_unknown_model(tmp_path: Path) -> None:
    _one_line_error(
        swarm_command("generate", "--prompt", "hi", "--model", "gpt-17", cache=tmp_path),
        "unknown model 'gpt-17'",
    )


def test_missing_model_file(tmp_path: Path) -> None:
    r = swarm_command(
        "generate", "--prompt", "hi", "--model", str(tmp_path / "x.gguf"), cache=tmp_path
    )
    _one_line_error(r, "no such file")


def test_corrupt_gguf_leaves_nothing_half_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(4096))
    r = swarm_command("generate", "--prompt", "hi", "--model", str(bad), cache=tmp_path / "cache")
    _one_line_error(r, "bad.gguf")
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())


def _gguf_string(text: str) -> bytes:
    return len(text).to_bytes(8, "little") + text.encode()


@pytest.mark.parametrize(
    ("old", "new", "fragments"),
    [
        # same lengths, so the file stays whole: only the tokenizer changes
        (_gguf_string("smollm"), _gguf_string("nosuch"), ("'nosuch'", "known: ", "qwen2")),
        (_gguf_string("gpt2"), _gguf_string("gpt9"), ("'gpt9'", "known: gpt2, llama")),
        (_gguf_string("tokenizer.ggml.model"), _gguf_string("tokenizer.ggml.mode_"), ("no tok",)),
    ],
)
def test_a_gguf_tokenizer_swarm_cannot_run_exactly_is_refused_in_one_line(
    tiny_gguf: Path, tmp_path: Path, old: bytes, new: bytes, fragments: tuple[str, ...]
) -> None:
    data = tiny_gguf.read_bytes()
    assert data.count(old) == 1
    bad = tmp_path / "tokenizer.gguf"
    bad.write_bytes(data.replace(old, new))
    r = swarm_command("generate", "--prompt", "hi", "--model", str(bad), cache=tmp_path / "cache")
    _one_line_error(r, *fragments)


def test_split_out_of_range(tiny_folder: Path, tmp_path: Path) -> None:
    r = swarm_command(
        "generate",
        "--prompt",
        "w1",
        "--raw",
        "--model",
        str(tiny_folder),
        "--split",
        "0:2,2:9",
        cache=tmp_path,
    )
    _one_line_error(r, "2:9", "4 layers")


def test_cache_dir_not_writable(tiny_folder: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("")
    r = swarm_command(
        "generate", "--prompt", "w1", "--model", str(tiny_folder), cache=blocker / "cache"
    )
    _one_line_error(r, "cannot write the model cache")


def test_bad_flag_value(tmp_path: Path) -> None:
    r = swarm_command("generate", "--prompt", "hi", "--dtype", "int3", cache=tmp_path)
    _one_line_error(r, "runtime.dtype")


def test_sampling_flags_have_the_api_bounds(tmp_path: Path) -> None:
    # the same table bounds both (swarm.sampling_settings), before a model or node is touched
    r = swarm_command(
        "generate", "--prompt", "hi", "--temperature", "3", "--node", "127.0.0.1:9", cache=tmp_path
    )
    _one_line_error(r, "temperature must be in [0.0, 2.0]")


def test_tiny_model_generates_through_a_split(tiny_folder: Path, tmp_path: Path) -> None:
    args = (
        "generate",
        "--prompt",
        "w5 w6 w7",
        "--raw",
        "--model",
        str(tiny_folder),
        "--max-tokens",
        "12",
    )
    whole = swarm_command(*args, cache=tmp_path)
    split = swarm_command(*args, "--split", "0:1,1:3,3:4", cache=tmp_path)
    assert whole.returncode == 0 and split.returncode == 0, whole.stderr + split.stderr
    assert whole.stdout == split.stdout
    assert "spans 0:1,1:3,3:4" in split.stderr


def test_a_draft_model_drafts_for_a_split_and_one_of_another_vocabulary_is_refused(
    tiny_folder: Path, tmp_path: Path
) -> None:
    args = ("generate", "--prompt", "w5 w6 w7", "--raw", "--model", str(tiny_folder))
    args = (*args, "--max-tokens", "12", "--split", "0:1,1:3,3:4")
    plain = swarm_command(*args, cache=tmp_path)
    drafted = swarm_command(*args, "--draft-model", str(tiny_folder), cache=tmp_path)
    assert plain.returncode == 0 and drafted.returncode == 0, plain.stderr + drafted.stderr
    assert drafted.stdout == plain.stdout
    other = tmp_path / "bytes-llama"
    write_tiny_bytes_llama(other)
    refused = swarm_command(*args, "--draft-model", str(other), cache=tmp_path)
    _one_line_error(refused, f"draft model {other} does not share the target's vocabulary")


@pytest.mark.slow
def test_real_model_answers_a_prompt() -> None:
    r = swarm_command(
        "generate",
        "--prompt",
        "What is the capital of France? Answer in one sentence.",
        "--split",
        "0:10,10:20,20:30",
        "--max-tokens",
        "24",
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "spans 0:10,10:20,20:30" in r.stderr


@pytest.mark.slow
def test_generate_through_a_node_prints_the_error_and_fails_when_the_answer_breaks_off(
    tiny_folder: Path, tmp_path: Path
) -> None:
    import asyncio
    import signal

    from harness.cluster import start_cluster
    from swarm.config import RuntimeConfig

    runtime = RuntimeConfig(model=str(tiny_folder), cache_dir=tmp_path / "cache", threads=1)
    flags = [["--span", "0:2", "--threads", "1"], ["--span", "2:4", "--threads", "1"]]
    cluster = asyncio.run(start_cluster(runtime, tmp_path / "state", flags, expect_serving=2))
    try:
        asking = subprocess.Popen(
            [
                *(sys.executable, "-m", "swarm", "generate", "--node", cluster.addresses[0]),
                *("--prompt", "w5 w6 w7", "--max-tokens", "200"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert asking.stdout is not None
        first = asking.stdout.read(1)  # the answer has started streaming
        cluster.processes[1].send_signal(signal.SIGKILL)  # the only server of layers 2:4
        _, err = asking.communicate(timeout=120)
    finally:
        cluster.stop()
    assert first and asking.returncode == 1, err
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1].startswith("swarm: error: the answer broke off: ")
    assert "2:4" in err.rstrip().splitlines()[-1]


def test_served_model_name_flag_reaches_the_config(tmp_path: Path) -> None:
    r = swarm_command("config", "--served-model-name", "home-llama", cache=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert 'served_model_name = "home-llama"' in r.stdout


def test_only_a_node_serves_several_models_and_each_must_be_found(tmp_path: Path) -> None:
    two = ("--model", "a.gguf", "--model", "b.gguf")
    r = swarm_command("generate", "--prompt", "hi", *two, cache=tmp_path)
    _one_line_error(r, "--model given 2 times (a.gguf, b.gguf): only `swarm node` serves several")
    r = swarm_command("node", *two, cache=tmp_path)
    _one_line_error(r, "a.gguf: no such file or folder")


def test_a_device_cap_splits_the_layers_and_the_text_stays(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """--gpu-memory on cpu splits the span into two groups as on a GPU (the stand-in): two of
    the tiny model's four layers in the device group, the same text as one group."""
    runtime = RuntimeConfig(model=str(tiny_folder), cache_dir=tmp_path)
    cap = cap_holding(ModelContext.open(runtime, progress=False), runtime, 2, 4)
    args = ("generate", "--prompt", "w5 w6 w7", "--raw", "--model", str(tiny_folder))
    whole = swarm_command(*args, "--max-tokens", "12", cache=tmp_path)
    split = swarm_command(*args, "--max-tokens", "12", "--gpu-memory", str(cap), cache=tmp_path)
    assert whole.returncode == 0 and split.returncode == 0, whole.stderr + split.stderr
    assert whole.stdout == split.stdout
    assert "layers 0:2 on cpu" in split.stderr and "layers 2:4 on the CPU" in split.stderr
