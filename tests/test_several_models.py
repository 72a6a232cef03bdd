"""Several models on one machine, decided before anything loads (swarm/several_models.py):
each model's node's ports, memory and state folder, the starts refused in one line, and
`[[models]]` read from bootstrap.toml."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from swarm import cli
from swarm.config import Config, ModelEntry, load_config, load_models, model_entries
from swarm.config_files import config_as_toml
from swarm.errors import ConfigError
from swarm.several_models import (
    ModelSize,
    check_distinct,
    child_ports,
    folder_name,
    least_memory,
    memory_shares,
    plan_children,
)

MB = 10**6
SMOL = ModelSize(90 * MB, 30)  # 3 MB a layer
TINY = ModelSize(3 * MB, 3)  # 1 MB a layer


@pytest.mark.parametrize(
    ("port", "count", "ports"),
    [
        (7420, 1, ((7420, 7421),)),
        (7420, 2, ((7420, 7421), (7422, 7423))),
        (18000, 3, ((18000, 18001), (18002, 18003), (18004, 18005))),
        (65532, 2, ((65532, 65533), (65534, 65535))),
    ],
)
def test_model_k_takes_port_plus_2k_and_the_one_after(
    port: int, count: int, ports: tuple[tuple[int, int], ...]
) -> None:
    assert child_ports(port, count) == ports


@pytest.mark.parametrize(
    ("port", "count", "message"),
    [
        (0, 2, "--port 0 (any free port) cannot serve several models"),
        (65534, 2, "2 models take ports 65534..65537, past 65535: choose a lower --port"),
    ],
)
def test_ports_that_cannot_be_laid_out_are_refused(port: int, count: int, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        child_ports(port, count)


@pytest.mark.parametrize(
    ("total", "given", "sizes", "shares"),
    [
        # split by the layers' bytes: 90 to 3
        (93 * MB, [0, 0], [SMOL, TINY], (90 * MB, 3 * MB)),
        (186 * MB, [0, 0], [SMOL, TINY], (180 * MB, 6 * MB)),
        # a share given is taken as it is; the others split what it leaves
        (100 * MB, [0, 10 * MB], [SMOL, TINY], (90 * MB, 10 * MB)),
        (50 * MB, [0, 60 * MB], [SMOL, TINY], (0, 60 * MB)),
        # every share given: the total does not matter
        (1, [5 * MB, 7 * MB], [SMOL, TINY], (5 * MB, 7 * MB)),
        # a size unknown here (fetched from peers) weighs as the known ones on average
        (100 * MB, [0, 0], [ModelSize(50 * MB, 5), None], (50 * MB, 50 * MB)),
        (90, [0, 0, 0], [None, None, None], (30, 30, 30)),
    ],
)
def test_memory_is_split_by_the_models_bytes(
    total: int, given: list[int], sizes: list[ModelSize | None], shares: tuple[int, ...]
) -> None:
    assert memory_shares(total, given, sizes) == shares


@pytest.mark.parametrize(
    ("given", "sizes", "least"),
    [
        # a layer of each: tiny's 1 MB is 3/93 of the total, so 31 MB in all
        ([0, 0], [SMOL, TINY], 31 * MB),
        ([0, 4 * MB], [SMOL, TINY], 7 * MB),
        ([0, 0], [SMOL, None], 6 * MB),
        ([0, 0], [None, None], 0),
    ],
)
def test_the_least_memory_that_holds_a_layer_of_each(
    given: list[int], sizes: list[ModelSize | None], least: int
) -> None:
    assert least_memory(0, given, sizes) == least
    shares = memory_shares(least, given, sizes)
    assert all(s is None or share >= s.one_layer for s, share in zip(sizes, shares, strict=True))


def _machine(**node: object) -> Config:
    config = load_config(
        overrides={
            "node": {"port": 18000, "state_dir": "/srv/swarm", **node},
            "api": {"token": "t"},
        },
        environ={},
    )
    return replace(config, runtime=replace(config.runtime, layer_memory_bytes=186 * MB))


ENTRIES = (ModelEntry("smollm2-135m-instruct"), ModelEntry("/m/tiny.gguf"))
NAMES = ("smollm2-135m-instruct", "tiny")


def test_each_model_gets_its_ports_memory_folder_and_the_first_node_to_join() -> None:
    smol, tiny = plan_children(_machine(), ENTRIES, NAMES, (SMOL, TINY), available=0)
    assert (smol.port, smol.fast_port, tiny.port, tiny.fast_port) == (18000, 18001, 18002, 18003)
    assert (smol.layer_memory_bytes, tiny.layer_memory_bytes) == (180 * MB, 6 * MB)
    assert (smol.join, tiny.join) == ((), ("127.0.0.1:18000",))
    config = tiny.config(_machine())
    assert config.runtime.model == "/m/tiny.gguf" and config.runtime.layer_memory_bytes == 6 * MB
    assert (config.node.port, config.net.fast_port) == (18002, 18003)
    assert config.node.state_dir == Path("/srv/swarm/models/tiny")
    assert config.node.join == ("127.0.0.1:18000",)


def test_a_machine_joining_a_swarm_joins_every_model_to_it_and_moves_its_advertised_port() -> None:
    machine = _machine(host="0.0.0.0", join=("10.0.0.2:7420",), advertise="203.0.113.5:18000")
    smol, tiny = plan_children(machine, ENTRIES, NAMES, (SMOL, TINY), available=0)
    assert smol.join == ("10.0.0.2:7420",)
    assert tiny.join == ("10.0.0.2:7420", "127.0.0.1:18000")
    assert (smol.advertise, tiny.advertise) == ("203.0.113.5:18000", "203.0.113.5:18002")


def test_automatic_memory_is_70_percent_of_what_is_free_split_by_bytes() -> None:
    machine = _machine()
    machine = replace(machine, runtime=replace(machine.runtime, layer_memory_bytes=0))
    smol, tiny = plan_children(machine, ENTRIES, NAMES, (SMOL, TINY), available=930 * MB)
    assert (smol.layer_memory_bytes, tiny.layer_memory_bytes) == (630 * MB, 21 * MB)


@pytest.mark.parametrize(
    ("entries", "names", "message"),
    [
        (
            (ModelEntry("a.gguf"), ModelEntry("a.gguf")),
            ("a", "a"),
            "model 'a.gguf' is given twice",
        ),
        (
            (ModelEntry("x/a.gguf"), ModelEntry("y/a.gguf")),
            ("a", "a"),
            "models 'x/a.gguf' and 'y/a.gguf' both go by the name 'a'",
        ),
        (
            (ModelEntry("a.gguf"), ModelEntry("b.gguf")),
            ("org/m", "org_m"),
            "models 'a.gguf' and 'b.gguf' both go by the name 'org_m'",
        ),
    ],
)
def test_a_model_or_a_name_given_twice_is_refused(
    entries: tuple[ModelEntry, ...], names: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_distinct(entries, names)


def test_names_become_folders() -> None:
    assert folder_name("org/model:latest") == "org_model_latest"
    assert folder_name("Qwen2.5-0.5B_x") == "Qwen2.5-0.5B_x"


def _refusal(machine: Config, sizes: tuple[ModelSize | None, ...] = (SMOL, TINY)) -> str:
    with pytest.raises(ConfigError) as raised:
        plan_children(machine, ENTRIES, NAMES, sizes, available=0)
    return str(raised.value)


def test_memory_that_cannot_hold_a_layer_of_each_is_refused_naming_each_models_bytes() -> None:
    machine = _machine()
    machine = replace(machine, runtime=replace(machine.runtime, layer_memory_bytes=2 * MB))
    assert _refusal(machine) == (
        "memory for layers (--layer-memory-bytes 2.0 MB) cannot hold a layer of each model: "
        "smollm2-135m-instruct's 30 layers take 90.0 MB (its share 1.9 MB), tiny's 3 layers "
        "take 3.0 MB (its share 0.1 MB); give --layer-memory-bytes at least 31.0 MB"
    )
    # a size unknown here is not held to it
    assert plan_children(machine, ENTRIES, NAMES, (None, TINY), available=0)


def test_a_share_given_too_small_is_named() -> None:
    entries = (ENTRIES[0], replace(ENTRIES[1], layer_memory_bytes=MB // 2))
    with pytest.raises(ConfigError, match="give tiny more layer_memory_bytes in"):
        plan_children(_machine(), entries, NAMES, (SMOL, TINY), available=0)


@pytest.mark.parametrize(
    ("section", "setting", "message"),
    [
        ("net", {"fast_port": 9000}, "--fast-port cannot be set with several models"),
        ("placement", {"span": "0:10"}, "--span names one model's layers"),
        ("speculation", {"draft_model": "x.gguf"}, "--draft-model drafts for one model"),
        ("api", {"served_model_name": "m"}, "--served-model-name names one model"),
        ("runtime", {"device": "cuda"}, "several models on one GPU need --gpu-memory"),
    ],
)
def test_settings_of_one_model_are_refused_with_several(
    section: str, setting: dict[str, object], message: str
) -> None:
    machine = _machine()
    machine = replace(machine, **{section: replace(getattr(machine, section), **setting)})
    assert message in _refusal(machine)


def test_a_gpu_is_split_as_the_memory_is() -> None:
    machine = _machine()
    runtime = replace(machine.runtime, device="cuda", gpu_memory_bytes=93 * MB)
    machine = replace(machine, runtime=runtime)
    smol, tiny = plan_children(machine, ENTRIES, NAMES, (SMOL, TINY), available=0)
    assert (smol.gpu_memory_bytes, tiny.gpu_memory_bytes) == (90 * MB, 3 * MB)


@pytest.mark.parametrize(
    ("raw", "entries"),
    [
        ([{"model": "a.gguf"}], (ModelEntry("a.gguf"),)),
        (
            [
                {"model": " a.gguf "},
                {"model": "b", "layer_memory_bytes": "2GiB", "served_model_name": "bee"},
                {"model": "c", "layer_memory_bytes": 1000},
            ],
            (
                ModelEntry("a.gguf"),
                ModelEntry("b", 2 * 1024**3, "bee"),
                ModelEntry("c", 1000),
            ),
        ),
    ],
)
def test_models_tables_are_read(raw: object, entries: tuple[ModelEntry, ...]) -> None:
    assert model_entries(raw, "f.toml") == entries


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model": "a"}, "f.toml: models must be tables, each [[models]]"),
        ([{"model": ""}], "f.toml: [[models]] 1 needs model = "),
        ([{"model": "a"}, {"span": "0:3"}], "unknown setting models.span in [[models]] 2"),
        ([{"model": "a", "layer_memory_bytes": "lots"}], "models.layer_memory_bytes must be"),
        ([{"model": "a", "layer_memory_bytes": -1}], "models.layer_memory_bytes must be >= 0"),
        ([{"model": 3}], "[[models]] 1 needs model = "),
    ],
)
def test_bad_models_tables_are_one_clear_error(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        model_entries(raw, "f.toml")
    assert message in str(raised.value)


def test_a_file_with_models_tables_loads_its_other_settings_as_before(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.toml"
    path.write_text(
        '[node]\nport = 9000\n\n[[models]]\nmodel = "a.gguf"\n\n[[models]]\nmodel = "b.gguf"\n'
    )
    assert load_config(path, environ={}).node.port == 9000
    assert load_models(path) == (ModelEntry("a.gguf"), ModelEntry("b.gguf"))
    assert load_models(None) == ()
    path.write_text('[runtime]\nmodel = "a.gguf"\n\n[[models]]\nmodel = "b.gguf"\n')
    with pytest.raises(ConfigError, match=re.escape("in runtime.model or in [[models]], not both")):
        load_models(path)


def test_several_models_print_as_tables_that_load_back(tmp_path: Path) -> None:
    entries = (ModelEntry("a.gguf"), ModelEntry("b.gguf", 2 * MB, "bee"))
    config = load_config(overrides={"node": {"port": 9000}}, environ={})
    path = tmp_path / "effective.toml"
    path.write_text(config_as_toml(config, entries))
    assert load_config(path, environ={}) == config
    assert load_models(path) == entries


def test_one_models_table_sets_the_model_its_memory_and_name_as_flags_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bootstrap.toml"
    path.write_text(
        '[[models]]\nmodel = "a.gguf"\nlayer_memory_bytes = "3MB"\nserved_model_name = "ay"\n'
    )
    assert cli.main(["config", "--config", str(path)]) == 0
    printed = capsys.readouterr().out
    assert 'model = "a.gguf"' in printed and "[[models]]" not in printed
    assert "layer_memory_bytes = 3000000" in printed and 'served_model_name = "ay"' in printed
    # a flag still wins over the file
    assert cli.main(["config", "--config", str(path), "--served-model-name", "bee"]) == 0
    assert 'served_model_name = "bee"' in capsys.readouterr().out


def test_a_device_cap_leaves_the_fit_to_each_node() -> None:
    machine = _machine()
    runtime = replace(machine.runtime, layer_memory_bytes=MB, gpu_memory_bytes=930 * MB)
    smol, tiny = plan_children(
        replace(machine, runtime=runtime), ENTRIES, NAMES, (SMOL, TINY), available=0
    )
    assert (smol.gpu_memory_bytes, tiny.gpu_memory_bytes) == (900 * MB, 30 * MB)
