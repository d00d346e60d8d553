"""The content scan as what is sent (issue 57, findings 1-5): each case goes
through the remote engine's outbound request (a loopback engine written in
tests/test_remote.py records the bodies) or, for file names and links, the
secret-file rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from soldaemon.api import CompletionRequest, ContextChunk
from soldaemon.config import config_from_dict
from soldaemon.privacy.rules import ContextPolicy, redact, redact_request
from soldaemon.remote.engine import RemoteEngine
from tests.test_remote import ScriptedEngine, _run, scripted, tiny_tokenizer  # noqa: F401 (the fixtures)

TOKENS = {
    "base64": "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWpr",
    "hex": "9f8e7d6c5b4a39281706f5e4d3c2b1a0ffeeddcc",
    "openai": "sk-proj-4fJ9xQ2mZr7LkP0sW3vB8nT6yH1cD5eG",
    "password": "Tr0ub4dor&3-horse",
}
KEY_BODY = ("MIIEpAIBAAKCAQEA1c2VjcmV0LWtleS1ib2R5LWxpbmUtb25lLWZvci10ZXN0aW5n\n"
            "Qm9keUxpbmVUd29PZlRoZUtleVdpdGhNaXhlZENhc2UxMjM0NTY3ODkwYWJjZGVm\n"
            "TGluZVRocmVlOXhZejEyMzRBYkNkRWZHaElqS2xNbk9wUXJTdFV2V3hZejAxMjM0\n")


def _sent(tokenizer: Any, engine: ScriptedEngine, **fields: Any) -> str:
    """What the remote engine received for one request with ``fields``."""
    fields.setdefault("uri", "file:///w/proj/app.py")
    # n_ctx with room for context beside the windows
    config = config_from_dict({"backend": {"kind": "remote", "url": engine.url}, "model": {"max_context": 16384}})
    _run(RemoteEngine(config, tokenizer, "tiny"), CompletionRequest(id="s", max_tokens=8, **fields))
    assert engine.attempts == 1
    return json.dumps(engine.bodies[-1])


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize("after", ['"\nprint(1)\n', "\nprint(1)\n"], ids=["closed-after", "open"])
def test_a_string_open_at_the_cursor_is_scanned(tiny_tokenizer: Any, scripted: ScriptedEngine,
                                                kind: str, after: str) -> None:
    """Finding 1: the token being typed, the quote after the cursor or none."""
    name = "PASSWORD" if kind == "password" else "API_TOKEN"
    body = _sent(tiny_tokenizer, scripted, prefix=f'import os\n{name} = "{TOKENS[kind]}', suffix=after)
    assert TOKENS[kind] not in body and TOKENS[kind][:12] not in body, body
    assert "<redacted>" in body and "print(1)" in body


def test_a_token_split_at_the_cursor_is_one_token(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    """Finding 2: ``AKIAIOSFOD`` before the cursor, ``NN7EXAMPLE`` after it."""
    body = _sent(tiny_tokenizer, scripted, prefix="aws_id = AKIAIOSFOD", suffix="NN7EXAMPLE\nx = 1\n")
    assert "AKIAIOSFOD" not in body and "NN7EXAMPLE" not in body and "x = 1" in body


def test_a_key_body_without_its_header(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    """Finding 3: key bodies with an ``END`` line and none, no header, in
    definitions the relevance selector puts in the prompt (the code at the
    cursor calls them)."""
    context = (ContextChunk("file:///w/proj/a.py", "def read_key():\n    return '''\n" + KEY_BODY
                            + "-----END RSA PRIVATE KEY-----\n'''\n"),
               ContextChunk("file:///w/proj/b.py", "def load_body():\n    return '''\n" + KEY_BODY + "'''\n"),
               ContextChunk("file:///w/proj/c.py", "def helper_function_name():\n    return 42\n"))
    prefix = "a = read_key()\nb = load_body()\nc = helper_function_name()\nx = helper_function_name("
    body = _sent(tiny_tokenizer, scripted, prefix=prefix, suffix="\n", context=context)
    for name in ("def read_key", "def load_body", "def helper_function_name"):
        assert name in body, f"the context reaches the prompt: {name}"
    for line in KEY_BODY.splitlines():
        assert line[:16] not in body, line
    assert "END RSA PRIVATE KEY" not in body


def test_a_key_split_across_chunks_of_one_file() -> None:
    """Finding 3, two chunks of one file: the header in one, one body line
    in the next. What is sent is the redacted request (the prompt is built
    from its chunks, whichever the relevance selector keeps)."""
    req = CompletionRequest(id="s", uri="file:///w/proj/app.py", prefix="x = ", suffix="\n", context=(
        ContextChunk("file:///w/proj/k.py", "K = '''\n-----BEGIN RSA PRIVATE KEY-----"),
        ContextChunk("file:///w/proj/k.py", KEY_BODY.splitlines()[0] + "\nrest = 1\n")))
    redacted, withheld = redact_request(req)
    assert withheld
    sent = "".join(chunk.text for chunk in redacted.context)
    assert KEY_BODY[:16] not in sent


@pytest.mark.parametrize("line,value", [
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuv", "sk-proj-abcdefghijklmnopqrstuv"),
    ("SECRET_KEY=django-insecure-q8+vz!k2", "django-insecure-q8+vz!k2"),
    ("SMTP_PASSWORD=correcthorsebattery", "correcthorsebattery"),
    ("export GITLAB_TOKEN=glpat_abcdefgh", "glpat_abcdefgh"),
    ("db_password: s3cr3t-pass", "s3cr3t-pass"),
])
def test_env_content_under_another_name(tiny_tokenizer: Any, scripted: ScriptedEngine, line: str, value: str) -> None:
    """Finding 4, content: ``.env`` lines in ``config.txt``."""
    body = _sent(tiny_tokenizer, scripted, uri="file:///w/proj/config.txt", prefix=f"DEBUG=1\n{line}\n", suffix="")
    assert value not in body and "DEBUG=1" in body


@pytest.mark.parametrize("code", ["API_KEY = os.environ['API_KEY']", "primary_key=True", "TOKEN = None",
                                  "cache_key = f'{user}:{page}'", "getUserAccountSettingsForId42 = 1",
                                  "sort_key = lambda row: row.name", "    token: str", "    token = next_token",
                                  "self.password = password", 'EOS_TOKEN = "<|endoftext|>"', "MAX_TOKEN = 512",
                                  'model = load("acme/Chat-7B-Instruct")'])
def test_code_that_names_secrets_is_kept(code: str) -> None:
    assert redact(code + "\n", "app.py").text == code + "\n"


@pytest.mark.parametrize("name", [".env-prod", ".env_prod", "env.production", "#.env#", ".#.env", ".terraformrc",
                                  "creds.json", "private.key.txt", "database.yml", "wp-config.php"])
def test_the_secret_names_of_the_third_audit(name: str) -> None:
    """Finding 4, names."""
    assert ContextPolicy().refusal(f"file:///w/proj/{name.replace('#', '%23')}") is not None, name


def test_a_long_line_and_an_unquoted_token(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    """Finding 5: a token on a 5,000-character line, an unquoted one."""
    long = "data = [" + ", ".join(["1"] * 1700) + f", 'AKIAIOSFODNN7EXAMPLE', 2]"
    assert len(long) > 4000
    unquoted = "curl -H X-Api:Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2Rl https://x"
    body = _sent(tiny_tokenizer, scripted, prefix=f"{long}\n{unquoted}\n", suffix="")
    assert "AKIAIOSFODNN7EXAMPLE" not in body and "Zm9vYmFyYmF6" not in body


def test_links_are_resolved_before_dotdot(tmp_path: Path) -> None:
    """Finding 5: ``proj/link/../config`` is where ``link`` points, not ``proj/config``."""
    aws = tmp_path / "home" / ".aws"
    (aws / "cli").mkdir(parents=True)
    (aws / "config").write_text("[default]\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "link").symlink_to(aws / "cli")
    uri = "file://" + str(proj) + "/link/../config"
    assert ContextPolicy().refusal(uri) is not None
