"""Tests for soldaemon.config: defaults, search order, validation messages,
did-you-mean, YAML errors, the example file, loopback policy, memory budget."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from soldaemon.config import (
    BackendConfig,
    CompletionConfig,
    Config,
    DeviceConfig,
    MemoryBudget,
    ModelConfig,
    ServerConfig,
    SolConfig,
    config_from_dict,
    find_config_file,
    load_config,
)
from soldaemon.discovery import is_loopback_host
from soldaemon.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "sol_config.example.yaml"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real config may leak in: empty cwd, empty XDG config home, no env."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SOLDAEMON_CONFIG", raising=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def config_error(data: Any, source: str = "<dict>") -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source)
    return info.value.message


# --------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------


def test_defaults() -> None:
    c = Config.default()
    assert c.source is None
    assert c.sol == SolConfig(
        layer_heatmap_window=60.0,
        prefetch_depth=2,
        kv_folding_entropy_threshold=0.1,
        kv_folding_free_below=MemoryBudget(fraction=0.2),
        weight_offload_policy="layer",
        fallback_timeout_ms=50.0,
        memory_budget=None,
        idle_release_s=300.0,
    )
    assert c.model.path is None and c.model.draft_model is None
    assert (c.model.precision, c.model.max_context) == ("auto", 4096)
    assert (c.model.max_prefix_tokens, c.model.max_suffix_tokens, c.model.max_outline_tokens) == ("auto",) * 3
    assert c.device == DeviceConfig(device="auto", threads=None)
    assert c.server.host == "127.0.0.1" and c.server.port == 8765
    assert c.server.allow_remote is False and c.server.allowed_origins == ()
    assert c.server.token_file is None
    assert c.server.max_message_bytes == 1_048_576
    assert c.server.rate_limit_per_s == 200 and c.server.drain_timeout_s == 5
    assert c.completion == CompletionConfig(
        max_tokens=128, max_lines=8, multiline="auto", temperature=0.0, top_p=1.0,
        budget_ms=None, speculative=True, draft_tokens=8, token_healing=True, speculative_fim=True,
        block_end="model", second_choice=True,
    )
    assert c.backend == BackendConfig(
        kind="local", url=None, model_name=None, api_key_env=None, timeout_s=30.0
    )


def test_no_file_anywhere_gives_defaults() -> None:
    assert find_config_file(None) is None
    assert load_config() == Config.default()


def test_empty_dict_and_none_give_defaults() -> None:
    assert config_from_dict({}) == Config.default()
    assert config_from_dict(None) == Config.default()


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(tmp_path: Path, text: str) -> None:
    f = write(tmp_path / "c.yaml", text)
    c = load_config(f)
    assert c.source == f.absolute()
    assert dataclasses.replace(c, source=None) == Config.default()


def test_null_section_keeps_defaults(tmp_path: Path) -> None:
    c = load_config(write(tmp_path / "c.yaml", "sol:\nserver: ~\n"))
    assert c.sol == SolConfig() and c.server == ServerConfig()


def test_config_is_frozen() -> None:
    c = Config.default()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sol.prefetch_depth = 3  # type: ignore[misc]


def test_token_path_follows_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(tmp_path / "state"))
    assert ServerConfig().token_path() == tmp_path / "state" / "token"
    explicit = config_from_dict({"server": {"token_file": "/x/tok"}})
    assert explicit.server.token_path() == Path("/x/tok")


# --------------------------------------------------------------------------
# Search order
# --------------------------------------------------------------------------


def _marker(path: Path, port: int) -> Path:
    return write(path, f"server:\n  port: {port}\n")


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _marker(tmp_path / "xdg" / "soldaemon" / "sol_config.yaml", 1001)
    assert find_config_file(None) == home
    assert load_config().server.port == 1001

    _marker(Path.cwd() / "sol_config.yaml", 1002)   # a project's file: never read
    assert find_config_file(None) == home
    assert load_config().server.port == 1001

    env = _marker(tmp_path / "env.yaml", 1003)
    monkeypatch.setenv("SOLDAEMON_CONFIG", str(env))
    assert find_config_file(None) == env
    assert load_config().server.port == 1003

    explicit = _marker(tmp_path / "explicit.yaml", 1004)
    assert find_config_file(explicit) == explicit
    c = load_config(str(explicit))
    assert c.server.port == 1004
    assert c.source == explicit.absolute()


def test_empty_env_var_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLDAEMON_CONFIG", "")
    _marker(Path.cwd() / "sol_config.yaml", 1002)
    assert find_config_file(None) is None


def test_the_current_directory_never_configures(caplog: pytest.LogCaptureFixture) -> None:
    """A cloned project's sol_config.yaml (the cwd an editor starts sol-lsp
    in) is not read, and the warning names the flag that reads it on purpose."""
    here = _marker(Path.cwd() / "sol_config.yaml", 1002)
    with caplog.at_level("WARNING", logger="sol.config"):
        assert find_config_file(None) is None
        assert load_config().server.port != 1002
    assert f"--config {here}" in caplog.text


def test_explicit_missing_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(missing) in info.value.message
    assert "does not exist" in info.value.message
    assert info.value.exit_code == 2


def test_explicit_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        find_config_file(tmp_path)


def test_env_missing_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _marker(Path.cwd() / "sol_config.yaml", 1002)  # must not be used instead
    monkeypatch.setenv("SOLDAEMON_CONFIG", str(tmp_path / "gone.yaml"))
    with pytest.raises(ConfigError) as info:
        load_config()
    assert "gone.yaml" in info.value.message and "SOLDAEMON_CONFIG" in info.value.message


def test_explicit_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    f = _marker(tmp_path / "mine.yaml", 1005)
    assert find_config_file("~/mine.yaml") == f


# --------------------------------------------------------------------------
# Validation: every key names itself and the bad value
# --------------------------------------------------------------------------

BAD_VALUES: list[tuple[str, str, Any, str]] = [
    # section, key, bad value, how the value shows in the message
    ("sol", "layer_heatmap_window", 0, "0"),
    ("sol", "layer_heatmap_window", "60", '"60"'),
    ("sol", "prefetch_depth", 17, "17"),
    ("sol", "prefetch_depth", -1, "-1"),
    ("sol", "prefetch_depth", "2", '"2"'),
    ("sol", "prefetch_depth", 2.0, "2.0"),
    ("sol", "prefetch_depth", True, "true"),
    ("sol", "kv_folding_entropy_threshold", -0.1, "-0.1"),
    ("sol", "kv_folding_entropy_threshold", 1.5, "1.5"),
    ("sol", "kv_folding_free_below", "lots", '"lots"'),
    ("sol", "kv_folding_free_below", 0, "0"),
    ("sol", "weight_offload_policy", "layers", '"layers"'),
    ("sol", "fallback_timeout_ms", 0, "0"),
    ("sol", "fallback_timeout_ms", float("inf"), "inf"),
    ("sol", "memory_budget", "lots", '"lots"'),
    ("sol", "memory_budget", 0, "0"),
    ("sol", "memory_budget", 1.5, "1.5"),
    ("sol", "memory_budget", "150%", '"150%"'),
    ("sol", "memory_budget", True, "true"),
    ("sol", "idle_release_s", -1, "-1"),
    ("model", "path", 5, "5"),
    ("model", "path", "", '""'),
    ("model", "max_context", 255, "255"),
    ("model", "max_context", 131073, "131073"),
    ("model", "max_prefix_tokens", 0, "0"),
    ("model", "max_suffix_tokens", -1, "-1"),
    ("model", "max_suffix_tokens", "big", '"big"'),
    ("model", "max_prefix_tokens", 1.5, "1.5"),
    ("model", "draft_model", ["a"], "['a']"),
    ("model", "fim_order", "pms", "\"pms\""),
    ("model", "fim_anchor", "word", "\"word\""),
    ("model", "max_context_tokens", -1, "-1"),
    ("model", "max_outline_tokens", -1, "-1"),
    ("model", "name", "qwen-7b", '"qwen-7b"'),
    ("model", "ttft_budget_ms", 0, "0"),
    ("model", "decode_budget_ms", -1, "-1"),
    ("model", "draft", "big", '"big"'),
    ("device", "cuda_graphs", "yes", "\"yes\""),
    ("model", "kv_sessions", 0, "0"),
    ("model", "precision", "int3", '"int3"'),
    ("model", "blocked_copy", "sometimes", "\"sometimes\""),
    ("device", "device", "gpu", '"gpu"'),
    ("device", "device", "cuda:x", '"cuda:x"'),
    ("device", "threads", 0, "0"),
    ("device", "threads", "4", '"4"'),
    ("server", "host", "", '""'),
    ("server", "host", 127, "127"),
    ("server", "port", 65536, "65536"),
    ("server", "port", -1, "-1"),
    ("server", "allow_remote", "yes please", '"yes please"'),
    ("server", "allow_remote", 1, "1"),
    ("server", "allowed_origins", "http://x", '"http://x"'),
    ("server", "allowed_origins", ["ok", 3], "['ok', 3]"),
    ("server", "token_file", False, "false"),
    ("server", "max_message_bytes", 0, "0"),
    ("server", "rate_limit_per_s", 0, "0"),
    ("server", "drain_timeout_s", -0.5, "-0.5"),
    ("server", "idle_exit_s", -1, "-1"),
    ("completion", "max_tokens", 0, "0"),
    ("completion", "max_tokens", 2049, "2049"),
    ("completion", "max_lines", 0, "0"),
    ("completion", "multiline", "many", '"many"'),
    ("completion", "temperature", -0.1, "-0.1"),
    ("completion", "top_p", 0, "0"),
    ("completion", "top_p", 1.01, "1.01"),
    ("completion", "budget_ms", 0, "0"),
    ("completion", "budget_ms", "100ms", '"100ms"'),
    ("completion", "speculative", "true", '"true"'),
    ("completion", "draft_tokens", 0, "0"),
    ("completion", "draft_tokens", 8.5, "8.5"),
    ("completion", "token_healing", "yes", '"yes"'),
    ("completion", "speculative_fim", "on", '"on"'),
    ("completion", "block_end", "parser", '"parser"'),
    ("completion", "second_choice", 1, "1"),
    ("completion", "candidates", 0, "0"),
    ("completion", "candidates", 9, "9"),
    ("backend", "kind", "cloud", '"cloud"'),
    ("backend", "url", "ftp://x", '"ftp://x"'),
    ("backend", "model_name", 3, "3"),
    ("backend", "api_key_env", "MY-KEY", '"MY-KEY"'),
    ("backend", "timeout_s", 0, "0"),
    ("backend", "api_key_file", "", '""'),
    ("backend", "tokenizer", 7, "7"),
    ("backend", "prompt_format", "ids", '"ids"'),
    ("backend", "connect_timeout_s", 0, "0"),
    ("backend", "retries", 6, "6"),
    ("backend", "backoff_s", -1, "-1"),
    ("backend", "max_backoff_s", 0, "0"),
    ("backend", "health_interval_s", "5s", '"5s"'),
    ("backend", "fallback_local", "yes", '"yes"'),
    ("backend", "send_untitled", "no", '"no"'),
    ("backend", "allow_insecure", "no", '"no"'),
]


def _all_keys() -> set[str]:
    sections = {"sol": SolConfig, "model": ModelConfig, "device": DeviceConfig,
                "server": ServerConfig, "completion": CompletionConfig,
                "backend": BackendConfig}
    return {f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)}


def test_bad_values_cover_every_key() -> None:
    assert {f"{s}.{k}" for s, k, _, _ in BAD_VALUES} == _all_keys()


@pytest.mark.parametrize(("section", "key", "value", "shown"), BAD_VALUES)
def test_bad_value_names_key_and_value(section: str, key: str, value: Any, shown: str) -> None:
    message = config_error({section: {key: value}}, source="my.yaml")
    assert message.startswith("my.yaml")
    assert f"{section}.{key} = {shown}" in message
    assert "expected" in message


def test_error_in_file_names_file_line_key_and_allowed(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  layer_heatmap_window: 30\n  prefetch_depth: 20\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert f"{f.absolute()}:3: sol.prefetch_depth = 20 (an integer): expected an integer in 0..16" \
        in info.value.message


def test_string_is_not_a_number_and_says_so() -> None:
    message = config_error({"sol": {"prefetch_depth": "3"}})
    assert '"3" (a string)' in message and "an integer in 0..16" in message


def test_choice_error_lists_options_and_suggests() -> None:
    message = config_error({"model": {"precision": "float61"}})
    assert '"auto", "float32", "bfloat16", "float16", "int8", "int4"' in message
    assert "did you mean 'float16'?" in message


def test_all_problems_reported_together() -> None:
    message = config_error({"sol": {"prefetch_depth": 99}, "server": {"port": "x"}})
    lines = message.splitlines()
    assert len(lines) == 2
    assert "sol.prefetch_depth = 99" in lines[0] and 'server.port = "x"' in lines[1]


def test_section_must_be_mapping() -> None:
    message = config_error({"sol": [1, 2]})
    assert "sol = [1, 2]" in message and "a mapping" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_mapping(tmp_path: Path, text: str) -> None:
    f = write(tmp_path / "c.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(f.absolute()) in info.value.message
    assert "top level must be a mapping" in info.value.message


def test_valid_values_are_accepted_and_typed(tmp_path: Path) -> None:
    f = write(
        tmp_path / "c.yaml",
        """
sol:
  layer_heatmap_window: 1.5e2
  prefetch_depth: 0
  kv_folding_entropy_threshold: 0.3
  weight_offload_policy: block
  fallback_timeout_ms: 12
  memory_budget: 75%
  idle_release_s: 0
model:
  path: models/coder.gguf
  precision: bfloat16
  max_context: 8192
  max_prefix_tokens: 4000
  max_suffix_tokens: 0
  draft_model: ~/drafts/tiny
device:
  device: cuda:1
  threads: 4
server:
  host: localhost
  port: 0
  allowed_origins: [vscode-webview://abc, "http://localhost:3000"]
  token_file: tok
completion:
  max_tokens: 128
  multiline: single
  temperature: 0.2
  top_p: 0.9
  budget_ms: 150
  speculative: false
  draft_tokens: 4
backend:
  kind: remote
  url: https://example.invalid/v1
  model_name: coder
  api_key_env: SOL_KEY
  timeout_s: 5
""",
    )
    c = load_config(f)
    assert c.sol.layer_heatmap_window == 150.0
    assert isinstance(c.sol.fallback_timeout_ms, float) and c.sol.fallback_timeout_ms == 12.0
    assert c.sol.memory_budget == MemoryBudget(fraction=0.75)
    assert c.sol.weight_offload_policy == "block" and c.sol.idle_release_s == 0.0
    # relative paths are relative to the config file's directory; ~ is expanded
    assert c.model.path == tmp_path / "models" / "coder.gguf"
    assert c.model.draft_model == Path("~/drafts/tiny").expanduser()
    assert c.server.token_file == tmp_path / "tok"
    assert c.device == DeviceConfig(device="cuda:1", threads=4)
    assert c.server.allowed_origins == ("vscode-webview://abc", "http://localhost:3000")
    assert c.completion.budget_ms == 150.0 and c.completion.speculative is False
    assert c.backend.kind == "remote" and c.backend.api_key_env == "SOL_KEY"


def test_dict_paths_stay_relative_without_base_dir(tmp_path: Path) -> None:
    assert config_from_dict({"model": {"path": "m.gguf"}}).model.path == Path("m.gguf")
    based = config_from_dict({"model": {"path": "m.gguf"}}, base_dir=tmp_path)
    assert based.model.path == tmp_path / "m.gguf"


def test_context_must_fit_prefix_suffix_and_completion() -> None:
    message = config_error(
        {"model": {"max_context": 1024, "max_prefix_tokens": 1000}, "completion": {"max_tokens": 64}}
    )
    assert "model.max_context = 1024" in message
    assert "model.max_prefix_tokens (1000)" in message and "completion.max_tokens (64)" in message


def test_remote_backend_needs_url() -> None:
    message = config_error({"backend": {"kind": "remote"}})
    assert "backend.kind" in message and "backend.url is required" in message


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  prefetch_depth: 1\n  prefetch_depth: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert ":3: sol.prefetch_depth: duplicate key (first at line 2)" in info.value.message


# --------------------------------------------------------------------------
# Unknown keys
# --------------------------------------------------------------------------


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  prefetch_depth: 2\nservr:\n  port: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    message = info.value.message
    assert f"{f.absolute()}:3: servr: unknown key" in message
    assert "did you mean 'server'?" in message


def test_unknown_section_key_suggests(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  prefech_depth: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    message = info.value.message
    assert ":2: sol.prefech_depth: unknown key" in message
    assert "did you mean 'prefetch_depth'?" in message


def test_a_retired_key_loads_with_a_warning_that_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A key a release removed (model.cache_reuse, completion.hold_end, …)
    does not stop the daemon: the file loads, the key is ignored, and the log
    names the key, its line and why it went."""
    from soldaemon.config.build import RETIRED
    from soldaemon.config.sections import SECTIONS

    f = write(tmp_path / "c.yaml", "model:\n  cache_reuse: 256\ncompletion:\n  hold_end: true\n  max_lines: 5\n")
    with caplog.at_level("WARNING", logger="soldaemon.config"):
        config = load_config(f)
    assert config.completion.max_lines == 5
    assert f"{f.absolute()}:2: model.cache_reuse is no longer read" in caplog.text
    assert f"{f.absolute()}:4: completion.hold_end is no longer read" in caplog.text
    for dotted in RETIRED:      # none of them is a live key again
        section, key = dotted.split(".")
        assert key not in {fl.name for fl in dataclasses.fields(SECTIONS[section])}, dotted


def test_key_in_wrong_place_suggests_its_section() -> None:
    assert "did you mean 'sol.prefetch_depth'?" in config_error({"prefetch_depth": 2})
    assert "did you mean 'server.port'?" in config_error({"model": {"port": 1}})


def test_unknown_key_without_close_match_lists_known() -> None:
    message = config_error({"device": {"zzzzzz": 1}})
    assert "device.zzzzzz: unknown key" in message
    assert "known keys here: device, threads" in message


def test_non_string_key_is_unknown() -> None:
    message = config_error({"sol": {1: 2}})
    assert "sol.1: unknown key 1" in message


# --------------------------------------------------------------------------
# YAML and file errors
# --------------------------------------------------------------------------


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  prefetch_depth: 2\n  bad: [1, 2\nserver:\n  port: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    message = info.value.message
    assert message.startswith(f"{f.absolute()}:")
    assert "YAML syntax error" in message
    line = int(message.split(":")[1])
    assert line in (3, 4, 5)  # the unclosed list starts on 3; the parser notices later
    assert "started at line 3" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_yaml_tab_error_names_line(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n\tprefetch_depth: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert info.value.message.startswith(f"{f.absolute()}:2:")


def test_non_utf8_file_is_config_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_bytes(b"sol:\n  prefetch_depth: \xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(f.absolute()) in info.value.message and "UTF-8" in info.value.message


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unreadable_file_is_config_error(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol: {}\n")
    f.chmod(0)
    try:
        with pytest.raises(ConfigError) as info:
            load_config(f)
        assert str(f.absolute()) in info.value.message and "cannot read" in info.value.message
    finally:
        f.chmod(0o600)


def test_read_error_is_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path / "c.yaml", "sol: {}\n")

    def refuse(self: Path, *args: Any, **kwargs: Any) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert info.value.message == f"{f.absolute()}: cannot read: Permission denied"


# --------------------------------------------------------------------------
# The example file
# --------------------------------------------------------------------------


def test_example_file_equals_defaults() -> None:
    c = load_config(EXAMPLE)
    assert c.source == EXAMPLE
    assert dataclasses.replace(c, source=None) == Config.default()


def test_example_file_lists_every_key() -> None:
    import yaml

    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    listed = {f"{s}.{k}" for s, keys in data.items() for k in keys}
    assert listed == _all_keys()


def test_docs_mention_every_key() -> None:
    docs = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    missing = [k for k in _all_keys() if f"`{k.split('.', 1)[1]}`" not in docs]
    assert missing == []


def test_docs_give_each_key_one_row_with_a_reason() -> None:
    """docs/config.md's section tables have one row per key, none for a key
    that is gone, and each row says why a user would set it."""
    import re

    rows: dict[str, list[str]] = {}
    section = None
    for line in (REPO / "docs" / "config.md").read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"## `(\w+):`", line):
            section = heading.group(1)
        elif line.startswith("## "):
            section = None
        elif section and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert f"{section}.{cells[0].strip('`')}" not in rows, line
            rows[f"{section}.{cells[0].strip('`')}"] = cells
    assert set(rows) == _all_keys()
    assert [k for k, cells in rows.items() if len(cells) != 5 or not cells[2]] == []


# --------------------------------------------------------------------------
# Loopback policy
# --------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"])
def test_loopback_hosts_are_allowed(host: str) -> None:
    assert is_loopback_host(host)
    assert config_from_dict({"server": {"host": host}}).server.host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com", "10.0.0.1"])
def test_non_loopback_host_refused_without_allow_remote(host: str) -> None:
    assert not is_loopback_host(host)
    message = config_error({"server": {"host": host}}, source="s.yaml")
    assert "server.host" in message and host in message and "server.allow_remote" in message
    allowed = config_from_dict({"server": {"host": host, "allow_remote": True}})
    assert allowed.server.host == host and allowed.server.allow_remote is True


def test_non_loopback_error_names_line(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "server:\n  port: 9000\n  host: 0.0.0.0\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert f'{f.absolute()}:3: server.host = "0.0.0.0"' in info.value.message


# --------------------------------------------------------------------------
# memory_budget
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1500, MemoryBudget(mb=1500)),
        (1, MemoryBudget(mb=1)),
        ("1500MB", MemoryBudget(mb=1500)),
        ("1500 mb", MemoryBudget(mb=1500)),
        ("512MiB", MemoryBudget(mb=512)),
        ("2GB", MemoryBudget(mb=2048)),
        ("1.5GB", MemoryBudget(mb=1536)),
        ("2GiB", MemoryBudget(mb=2048)),
        ("2g", MemoryBudget(mb=2048)),
        ("1T", MemoryBudget(mb=1024 * 1024)),
        ("75%", MemoryBudget(fraction=0.75)),
        ("100%", MemoryBudget(fraction=1.0)),
        (0.75, MemoryBudget(fraction=0.75)),
        (1.0, MemoryBudget(fraction=1.0)),
    ],
)
def test_memory_budget_parsing(value: Any, expected: MemoryBudget) -> None:
    assert MemoryBudget.parse(value) == expected
    assert config_from_dict({"sol": {"memory_budget": value}}).sol.memory_budget == expected


@pytest.mark.parametrize(
    "value", [0, -5, 0.0, 1.5, "0%", "101%", "1500", "2XB", "GB", "", True, [1], float("nan")]
)
def test_memory_budget_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        MemoryBudget.parse(value)
    message = config_error({"sol": {"memory_budget": value}})
    assert "sol.memory_budget" in message and '"75%"' in message


def test_memory_budget_null_and_yaml_forms(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "sol:\n  memory_budget: 2GB\n")
    assert load_config(f).sol.memory_budget == MemoryBudget(mb=2048)
    assert config_from_dict({"sol": {"memory_budget": None}}).sol.memory_budget is None


def test_memory_budget_resolve_bytes_and_str() -> None:
    assert MemoryBudget(mb=1500).resolve_bytes(10**12) == 1500 * 2**20
    assert MemoryBudget(fraction=0.5).resolve_bytes(8 * 2**30) == 4 * 2**30
    assert str(MemoryBudget(mb=1500)) == "1500MB"
    assert str(MemoryBudget(fraction=0.75)) == "75%"


def test_memory_budget_needs_exactly_one() -> None:
    with pytest.raises(ValueError):
        MemoryBudget()
    with pytest.raises(ValueError):
        MemoryBudget(mb=1, fraction=0.5)
    with pytest.raises(ValueError):
        MemoryBudget(fraction=1.5)


# --------------------------------------------------------------------------
# Round trip and overrides
# --------------------------------------------------------------------------


def test_to_dict_round_trips() -> None:
    c = config_from_dict(
        {
            "sol": {"memory_budget": "3GB", "prefetch_depth": 5},
            "model": {"path": "/m/x.gguf"},
            "server": {"allowed_origins": ["a"], "host": "::1"},
        }
    )
    assert config_from_dict(c.to_dict()) == c
    fraction = config_from_dict({"sol": {"memory_budget": 0.5}})
    assert config_from_dict(fraction.to_dict()) == fraction
    assert config_from_dict(Config.default().to_dict()) == Config.default()


def test_with_overrides_validates_and_keeps_source(tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "server:\n  port: 9000\n")
    c = load_config(f)
    d = c.with_overrides({"sol.prefetch_depth": 4, "completion.temperature": 0.5})
    assert d.sol.prefetch_depth == 4 and d.completion.temperature == 0.5
    assert d.server.port == 9000 and d.source == c.source
    assert c.sol.prefetch_depth == 2  # the original is unchanged
    with pytest.raises(ConfigError, match=r"--set: sol\.prefetch_depth = 99"):
        c.with_overrides({"sol.prefetch_depth": 99}, source="--set")
    with pytest.raises(ConfigError, match="did you mean 'prefetch_depth'"):
        c.with_overrides({"sol.prefetch_dept": 1})
    with pytest.raises(ConfigError, match="section.key"):
        c.with_overrides({"prefetch_depth": 1})


def test_prompt_windows_are_the_served_models_where_auto() -> None:
    from soldaemon.config.sections import GENERIC_WINDOWS, WINDOWS_BY_MODEL, PromptWindows

    default = Config.default().model
    # before a model is chosen (name auto) and for a path or remote model: the generic (widest) windows
    assert default.windows() == GENERIC_WINDOWS == PromptWindows(1024, 256, 128)
    assert default.windows("qwen2.5-coder-0.5b") == WINDOWS_BY_MODEL["qwen2.5-coder-0.5b"] == PromptWindows(768, 256, 0)
    assert default.windows("qwen2.5-coder-1.5b") == PromptWindows(1024, 256, 128)
    named = config_from_dict({"model": {"name": "qwen2.5-coder-0.5b"}}).model
    assert named.windows() == PromptWindows(768, 256, 0)
    path = config_from_dict({"model": {"name": "qwen2.5-coder-0.5b", "path": "/m.gguf"}}).model
    assert path.windows() == GENERIC_WINDOWS
    # a number set wins, key by key; "auto" written out is the default
    mixed = config_from_dict({"model": {"max_prefix_tokens": 900, "max_suffix_tokens": "auto",
                                        "max_outline_tokens": 64}}).model
    assert mixed.windows("qwen2.5-coder-0.5b") == PromptWindows(900, 256, 64)
    # served_by fixes the auto keys to numbers (load_engine, once the model is chosen); a round trip keeps them
    served = default.served_by("qwen2.5-coder-0.5b")
    assert (served.max_prefix_tokens, served.max_suffix_tokens, served.max_outline_tokens) == (768, 256, 0)
    assert served.windows("qwen2.5-coder-1.5b") == PromptWindows(768, 256, 0)
    again = Config(model=served).with_overrides({"model.draft": "off"}).model
    assert again.windows() == PromptWindows(768, 256, 0)
    # switching the model of an unresolved config switches its windows (the bench's --models columns)
    switched = Config.default().with_overrides({"model.name": "qwen2.5-coder-1.5b"}).model
    assert switched.windows() == PromptWindows(1024, 256, 128)


def test_auto_windows_are_checked_at_their_widest() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"model": {"max_context": 1300}, "completion": {"max_tokens": 64}})
    assert "model.max_prefix_tokens (1024)" in err.value.message
    config_from_dict({"model": {"max_context": 1300, "max_prefix_tokens": 768}, "completion": {"max_tokens": 64}})
