"""The secret rule's pure parts (issue 26): the fuller name list, every URI
scheme, real paths, the content scan, what leaves for a remote backend, and
the handshake gate's bounds. The real-process tests are in
tests/test_hostile_project.py and tests/test_server_handshakes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from soldaemon.api import CompletionRequest, ContextChunk
from soldaemon.server.handshake import HandshakeGate
from soldaemon.privacy.rules import ContextPolicy, SecretDocument, folder_paths, outbound, redact, redact_request

KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c2VjcmV0LWtleS1ib2R5LWxpbmUtb25lLWZvci10ZXN0\n"
       "-----END RSA PRIVATE KEY-----\n")


@pytest.mark.parametrize("name", [
    "kubeconfig", "prod.kubeconfig", "secret.yaml", "values-secrets.yaml", "client_secret_123.apps.json",
    "my-app-firebase-adminsdk-x1y2z.json", "prod.tfstate", "terraform.tfstate.backup", ".vault-token", ".s3cfg",
    ".boto", ".my.cnf", "pip.conf", ".yarnrc.yml", "gradle.properties", "settings.xml", "AuthKey_ABC.p8",
    "office.ovpn", "svc.keytab", "gh/hosts.yml", "gcloud/credentials.db", "gcloud/access_tokens.db",
    "application_default_credentials.json", ".env~", ".env.bak", "token.txt", "auth.json", ".dev.vars",
    "local.settings.json",
])
def test_the_names_the_first_list_missed(name: str) -> None:
    assert ContextPolicy().refusal(f"file:///w/proj/{name}") is not None, name


@pytest.mark.parametrize("name", ["secret_manager.py", "tokenizer.py", "auth.py", "settings.py", "env.py",
                                  "kube.py", "values.yaml", "README.md"])
def test_ordinary_names_still_pass(name: str) -> None:
    assert ContextPolicy().refusal(f"file:///w/proj/{name}") is None, name


def test_every_scheme_is_judged() -> None:
    remote = "vscode-remote://ssh-remote%2Bbox/w/proj"
    policy = ContextPolicy(folder_paths([remote, "file:///w/local"]))
    assert "secret" in (policy.refusal(f"{remote}/.env") or "")
    assert policy.allows(f"{remote}/app.py")
    assert policy.refusal("vscode-remote://other-host/w/proj/app.py") == "outside the workspace folders"
    assert policy.allows("vscode-notebook-cell:/w/local/nb.ipynb#W0sZmlsZQ%3D%3D")
    assert not policy.allows("vscode-notebook-cell:/w/local/.env#W0")
    for unknown in ("git:/w/local/a.py?ref=HEAD", "output:extension-output", "https://x/a.py", "weird"):
        assert not policy.allows(unknown) and not policy.may_complete(unknown), unknown
    assert policy.may_complete("untitled:Untitled-1") and not policy.allows("untitled:Untitled-1")


def test_links_are_judged_by_where_they_point(tmp_path: Path) -> None:
    home, proj = tmp_path / "home", tmp_path / "proj"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\n")
    (home / "notes.txt").write_text("n\n")
    proj.mkdir()
    (proj / "cloud.ini").symlink_to(home / ".aws" / "credentials")
    (proj / "notes.py").symlink_to(home / "notes.txt")
    (proj / "a.py").write_text("x\n")
    policy = ContextPolicy(folder_paths([proj.as_uri()]))
    assert "links to" in (policy.refusal((proj / "cloud.ini").as_uri()) or "")
    assert "outside the workspace" in (policy.refusal((proj / "notes.py").as_uri()) or "")
    assert policy.allows((proj / "a.py").as_uri())
    assert not ContextPolicy().allows((proj / "cloud.ini").as_uri())       # no folders known: the name rule still


def test_content_is_redacted_not_dropped() -> None:
    text = f"import os\n\nAWS = 'AKIAIOSFODNN7EXAMPLE'\nGH = 'ghp_abcdefghijklmnopqrstuvwxyz0123456789'\n{KEY}x = 1\n"
    found = redact(text, "notes.py")
    assert "AKIAIOSFODNN7EXAMPLE" not in found.text and "ghp_" not in found.text
    assert "PRIVATE KEY" not in found.text and "MIIEp" not in found.text
    assert found.text.startswith("import os\n\nAWS = '<redacted>'") and found.text.endswith("x = 1\n")
    assert "Private Key" in found.kinds and "AWS Access Key" in found.kinds
    assert redact("def add(a, b):\n    return a + b\n").kinds == ()
    cut = redact("k = '''\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\n")   # no END: to the end
    assert "b3Blbn" not in cut.text


def test_sol_lsp_requests_are_redacted_everywhere() -> None:
    req = CompletionRequest(id="1", prefix="TOKEN = 'ghp_abcdefghijklmnopqrstuvwxyz0123456789'\n", suffix=KEY,
                            uri="file:///w/a.py", context=(ContextChunk("file:///w/b.py", KEY),))
    clean, withheld = redact_request(req)
    assert "ghp_" not in clean.prefix and "PRIVATE" not in clean.suffix and "PRIVATE" not in clean.context[0].text
    assert clean.uri == req.uri and len(withheld) >= 3


def test_what_leaves_for_a_remote_backend(tmp_path: Path) -> None:
    repo = tmp_path / "alice" / "secret-project"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    main, util = (repo / "src" / "main.py").as_uri(), (repo / "util.py").as_uri()
    req = CompletionRequest(id="1", prefix=f"x = 1\n{KEY}", suffix="", uri=main,
                            context=(ContextChunk(util, "def u(): pass\n"), ContextChunk((repo / ".env").as_uri(), "A=1"),
                                     ContextChunk("untitled:Untitled-2", "scratch")))
    sent = outbound(req)
    assert sent.uri == "src/main.py" and [c.uri for c in sent.context] == ["util.py"]
    assert "alice" not in repr(sent) and "PRIVATE KEY" not in sent.prefix
    with pytest.raises(SecretDocument, match="untitled"):
        outbound(CompletionRequest(id="2", prefix="", suffix="", uri="untitled:Untitled-1"))
    assert outbound(CompletionRequest(id="3", prefix="a", suffix="", uri="untitled:Untitled-1"),
                    send_untitled=True).prefix == "a"
    assert outbound(CompletionRequest(id="4", prefix="a", suffix="")).prefix == "a"   # no document named
    with pytest.raises(SecretDocument):
        outbound(CompletionRequest(id="5", prefix="", suffix="", uri="vscode-remote://box/w/.env"))


def test_handshake_gate_closes_the_oldest() -> None:
    gate: HandshakeGate[int] = HandshakeGate(max_total=4, max_per_peer=2)
    assert gate.admit(1, "a") == [] and gate.admit(2, "a") == []
    assert gate.admit(3, "a") == [1]              # per peer: a's oldest
    assert gate.admit(4, "b") == [] and gate.admit(5, "c") == []
    assert gate.admit(6, "d") == [2]              # in all: the oldest of everyone
    gate.done(3)
    assert len(gate) == 3 and gate.evicted == 2
    with pytest.raises(ValueError):
        HandshakeGate(0, 1)
