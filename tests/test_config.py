from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from swarm.config import Config, load_config
from swarm.config_files import (
    config_as_toml,
    config_search_path,
    defaults_as_toml,
    find_config_file,
)
from swarm.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_repository_bootstrap_toml_changes_nothing() -> None:
    """Found by the config search when a node runs from the checkout, so it must be inert."""
    assert load_config(REPO / "bootstrap.toml", environ={}) == load_config(environ={})
    assert load_config(REPO / "bootstrap.toml", environ={}) == Config()


def test_repository_bootstrap_toml_is_the_defaults_written_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # the paths as most machines see them
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert (REPO / "bootstrap.toml").read_text() == defaults_as_toml(), (
        "bootstrap.toml is out of date: run `swarm config --defaults > bootstrap.toml`"
    )


def test_every_setting_is_in_bootstrap_toml_and_uncommenting_it_keeps_its_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each `# name = value` line, uncommented alone, gives the default Config back."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    text = defaults_as_toml()
    settings = re.findall(r"^# (\w+) = (.+?)(?:  # .*)?$", text, flags=re.MULTILINE)
    expected = {
        f"{section.name}.{item.name}"
        for section in dataclasses.fields(Config)
        for item in dataclasses.fields(getattr(Config(), section.name))
    }
    sections = re.findall(r"^\[(\w+)\]$", text, flags=re.MULTILINE)
    seen = set()
    section = ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
            continue
        match = re.match(r"^# (\w+) = (.+?)(?:  # .*)?$", line)
        if match is None:
            continue
        name, value = match.groups()
        seen.add(f"{section}.{name}")
        path = tmp_path / "one.toml"
        path.write_text(f"[{section}]\n{name} = {value}\n")
        assert load_config(path, environ={}) == Config(), line
    assert seen == expected and len(settings) == len(expected)
    assert sections == [f.name for f in dataclasses.fields(Config)]


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "swarm.toml"
    path.write_text('[runtime]\ndtype = "bfloat16"\nthreads = 2\nkv_cache_bytes = 1000\n')
    env = {"SWARM_RUNTIME_THREADS": "3", "HOME_UNRELATED": "x"}
    config = load_config(path, overrides={"runtime": {"kv_cache_bytes": "2000"}}, environ=env)
    assert config.runtime.dtype == "bfloat16"
    assert config.runtime.threads == 3
    assert config.runtime.kv_cache_bytes == 2000


def test_presets_differ() -> None:
    assert Config.local().runtime.kv_cache_bytes < Config.lan().runtime.kv_cache_bytes
    # nodes of tests on one machine stay apart unless told to join; a LAN's find each other
    assert (Config.local().node.discover, Config.lan().node.discover) == (False, True)


@pytest.mark.parametrize(
    ("argv", "environ", "discover"),
    [
        ([], {}, True),
        (["--no-discover"], {}, False),
        ([], {"SWARM_NODE_DISCOVER": "false"}, False),
        (["--preset", "local"], {}, False),
    ],
)
def test_discovery_is_turned_off_by_flag_environment_or_preset(
    argv: list[str], environ: dict[str, str], discover: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swarm import cli

    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    args = cli._parser().parse_args(["node", "--config", str(REPO / "bootstrap.toml"), *argv])
    assert cli._config_from(args).node.discover is discover


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[runtime]\ndtype = "int3"\n', "runtime.dtype must be one of"),
        ('[runtime]\ndtype = "float16"\n', "float16 needs device cuda"),
        ('[runtime]\nthreads = "many"\n', "runtime.threads must be int"),
        ("[runtime]\nkv_cache_bytes = 0\n", "kv_cache_bytes must be > 0"),
        ("[runtime]\ncolour = 1\n", "unknown setting runtime.colour"),
        ("[gossip]\nfanout = 3\n", "unknown config section"),
        ("[runtime\n", "not valid TOML"),
        ("[speculation]\nmax_draft_tokens = 0\n", "speculation.max_draft_tokens must be > 0"),
        ("[speculation]\nngram_max = 1\n", "speculation.ngram_max must be >= speculation"),
        ("[speculation]\nsmoothing = 1.5\n", "speculation.smoothing must be in"),
        ("[speculation]\npause_steps = -1\n", "speculation.pause_steps must be >= 0"),
        ('[speculation]\nenabled = "maybe"\n', "speculation.enabled must be"),
        ("[net]\nfast_port = 7420\n", "net.fast_port 7420 is the node's own port"),
        ("[net]\nfast_port = 70000\n", "net.fast_port must be a TCP port"),
        ("[net]\nspot_check_every = -1\n", "net.spot_check_every must be >= 0"),
        ("[net]\nspot_check_every_flagged = 0\n", "net.spot_check_every_flagged must be > 0"),
        ('[runtime]\ntest_flip_byte = "3"\n', "runtime.test_flip_byte must be layer:offset"),
        ('[runtime]\ntest_flip_byte = "a:-1"\n', "runtime.test_flip_byte must be layer:offset"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ={})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_node_section_types(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        '[node]\nport = 7500\njoin = ["10.0.0.2:7420"]\nsecret_file = "/etc/swarm.key"\n'
    )
    config = load_config(path, environ={"SWARM_NODE_JOIN": "a:1, b:2"})
    assert config.node.port == 7500
    assert config.node.join == ("a:1", "b:2")
    assert config.node.secret_file == Path("/etc/swarm.key")
    assert load_config(environ={"SWARM_NODE_SECRET_FILE": ""}).node.secret_file is None
    with pytest.raises(ConfigError, match="not host:port"):
        load_config(environ={"SWARM_NODE_JOIN": "nohost"})


def test_binding_beyond_loopback_needs_an_api_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a token: set api"):
        load_config(environ={"SWARM_NODE_HOST": "0.0.0.0"})
    token_file = tmp_path / "api.token"
    token_file.write_text("s3cret\n")
    env = {"SWARM_NODE_HOST": "0.0.0.0", "SWARM_API_TOKEN_FILE": str(token_file)}
    assert load_config(environ=env).api.resolve_token() == "s3cret"
    assert load_config(environ={"SWARM_API_TOKEN": "t0ken"}).api.resolve_token() == "t0ken"
    assert load_config(environ={}).api.resolve_token() is None  # loopback: no token needed


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SWARM_API_TOKEN_FILE": "/nonexistent/token"}, "cannot read api.token_file"),
        ({"SWARM_API_MAX_BODY_BYTES": "0"}, "max_body_bytes must be > 0"),
        ({"SWARM_API_MAX_CONCURRENT_REQUESTS": "-1"}, "max_concurrent_requests must be > 0"),
        ({"SWARM_API_TOKEN": "a", "SWARM_API_TOKEN_FILE": "/x"}, "not both"),
    ],
)
def test_bad_api_settings_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ=env).api.resolve_token()


def test_activation_codec_is_raw_by_default_and_checked() -> None:
    assert load_config(environ={}).net.activation_codec == "raw"
    env = {"SWARM_NET_ACTIVATION_CODEC": "int8_hadamard64"}
    assert load_config(environ=env).net.activation_codec == "int8_hadamard64"
    with pytest.raises(ConfigError, match="activation_codec must be one of"):
        load_config(environ={"SWARM_NET_ACTIVATION_CODEC": "zip"})


def test_a_config_file_is_found_without_flags_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    here, user, system = config_search_path(env)
    assert (here, user) == (tmp_path / "bootstrap.toml", tmp_path / "xdg/swarm/bootstrap.toml")
    assert system == Path("/etc/swarm/bootstrap.toml")
    if not system.exists():
        assert find_config_file(env) is None
    user.parent.mkdir(parents=True)
    user.write_text("[runtime]\nthreads = 1\n")
    assert find_config_file(env) == user
    here.write_text("[runtime]\nthreads = 2\n")
    assert find_config_file(env) == here


def test_the_effective_config_prints_as_toml_that_loads_back_without_the_token(
    tmp_path: Path,
) -> None:
    config = load_config(
        overrides={"api": {"token": "s3cret-token"}, "node": {"join": ("10.0.0.1:7420",)}},
        environ={},
    )
    text = config_as_toml(config)
    assert "s3cret-token" not in text and 'token = "<redacted>"' in text
    path = tmp_path / "effective.toml"
    path.write_text(text.replace('token = "<redacted>"', 'token = "other"'))
    again = load_config(path, environ={})
    assert again.node.join == ("10.0.0.1:7420",) and again.runtime == config.runtime
