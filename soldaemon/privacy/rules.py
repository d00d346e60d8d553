"""Which documents may be sent as model input: the one secret-file rule for sol-lsp and the remote
backend (secrets inside the text: :mod:`.scan`). A path or real path matching a secret glob (any
component or the whole path, case-insensitive, backup suffix stripped) is never sent, nor a file
outside known workspace folders. URIs of :data:`PATH_SCHEMES` are judged by path, ``untitled:`` as
a buffer, other schemes refused; :meth:`ContextPolicy.allows` never raises."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass
from typing import Sequence

from soldaemon.api import CompletionRequest, ContextChunk
from soldaemon.errors import BadRequest
from soldaemon.privacy.scan import REDACTED_MARK, Redacted, describe, redact, redact_around, redact_chunks

__all__ = ["PATH_SCHEMES", "REDACTED_MARK", "SECRET_PATTERNS", "ContextPolicy", "Redacted", "SecretDocument",
           "describe", "folder_paths", "is_secret_path", "outbound", "redact", "redact_around", "redact_chunks",
           "redact_request"]

# Files that hold credentials. SSH keys by key type: a bare ``id_*`` would refuse ``id_utils.py``.
SECRET_PATTERNS: tuple[str, ...] = (
    ".env", ".env.*", "*.env", ".envrc",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "id_xmss*", "*.ppk", "known_hosts", "authorized_keys",
    ".ssh", ".gnupg", ".git", ".hg", ".svn", ".aws", ".azure", ".gcloud", ".kube", ".docker",
    ".netrc", "_netrc", ".npmrc", ".pypirc", ".pgpass", ".git-credentials", ".htpasswd",
    "credentials", "credentials.*", "*credentials*.json", "secrets.*", "*.secret", "*.secrets",
    "token", "*.token", "service-account*.json", "terraform.tfstate*", "*.tfvars",
    # cluster, cloud, CI and package-manager credentials
    "kubeconfig", "*.kubeconfig", "kubeconfig.*", "secret.*", "*-secret.y*ml", "*-secrets.y*ml", "*_secrets.y*ml",
    "*secrets*.json", "client_secret*.json", "*-firebase-adminsdk-*.json", "*.tfstate", "*.tfstate.*",
    ".vault-token", ".s3cfg", ".boto", ".my.cnf", ".mylogin.cnf", "pip.conf", ".yarnrc", ".yarnrc.yml",
    "gradle.properties", "settings.xml", "settings-security.xml", "*.p8", "*.ovpn", "*.keytab",
    "gh/hosts.yml", "gcloud/*.db", "gcloud/legacy_credentials", "application_default_credentials.json",
    "token.*", "*_token", "*-token", "auth.json", ".dev.vars", "local.settings.json", ".pgpass", ".dockercfg",
    "*.jwk", "*.age", ".htaccess", "*.sqlite-credentials",
    # dotenv files under other names, tool and app credentials (Emacs' copies: _EDITOR_COPY)
    ".env-*", ".env_*", "env.production", "env.prod", "env.prod.*", "env.staging", "env.development", "env.dev",
    "env.local", "env.test", "*.env.txt", ".terraformrc", "terraform.rc", "creds.*", "*-creds.*", "*_creds.*",
    "private.key*", "private-key*", "private_key*", "*.key.txt", "*.pem.txt", "database.yml", "database.yaml",
    "wp-config.php", "master.key", "*.pkcs12",
)

# URI schemes whose path names a file (here or remote): the name rule applies to it.
PATH_SCHEMES: frozenset[str] = frozenset({
    "file", "vscode-remote", "vscode-notebook-cell", "vscode-notebook", "vscode-vfs", "vscode-userdata",
    "vsls", "remote", "ssh", "sftp", "wsl", "zipfile",
})
_BACKUP_SUFFIXES = ("~", ".bak", ".orig", ".old", ".swp", ".swo", ".tmp")
# an editor's copies of a file: Emacs' auto-save ``#.env#`` and lock ``.#.env``
_EDITOR_COPY = re.compile(r"^#(.+)#$|^\.#(.+)$")


@dataclass(frozen=True)
class _Where:
    """A URI of a :data:`PATH_SCHEMES` scheme, split."""

    scheme: str
    authority: str
    path: str           # ``..`` folded
    raw: str            # the path as the URI spells it

    @property
    def real(self) -> str:
        """The file on this machine, links resolved before ``..`` is folded
        (as the kernel does); a remote file's ``path``."""
        if self.scheme not in ("file", "vscode-notebook-cell", "vscode-notebook"):
            return self.path
        try:
            return os.path.realpath(self.raw)
        except (OSError, ValueError):
            return self.path


def _split(uri: str) -> _Where | None:
    """``uri`` split when its scheme is in :data:`PATH_SCHEMES`, else None."""
    try:
        parsed = urllib.parse.urlsplit(uri)
    except ValueError:
        return None
    scheme = parsed.scheme.lower()
    if scheme not in PATH_SCHEMES:
        return None
    raw = urllib.parse.unquote(parsed.path)
    if not raw.startswith("/"):
        return None
    path = posixpath.normpath(raw)
    return _Where(scheme, parsed.netloc.lower(), path, raw)


def _strip_backup(name: str) -> str:
    copy = _EDITOR_COPY.match(name)
    if copy is not None:
        name = copy.group(1) or copy.group(2)
    for suffix in _BACKUP_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _matches(path: str, patterns: Sequence[str]) -> bool:
    lowered = path.lower()
    parts = [p for p in lowered.split("/") if p]
    if parts and _strip_backup(parts[-1]) != parts[-1]:
        parts.append(_strip_backup(parts[-1]))
    for pattern in patterns:
        pat = pattern.lower().rstrip("/")
        if "/" in pat:
            if fnmatch.fnmatchcase(lowered, pat) or fnmatch.fnmatchcase(lowered, "*/" + pat.lstrip("/")):
                return True
        elif any(fnmatch.fnmatchcase(part, pat) for part in parts):
            return True
    return False


def is_secret_path(path: str, extra: Sequence[str] = ()) -> bool:
    """Whether ``path`` or a directory above it matches a secret pattern."""
    return _matches(path, (*SECRET_PATTERNS, *extra))


@dataclass(frozen=True)
class ContextPolicy:
    """What may be sent."""

    folders: tuple[str, ...] | None = None  # :func:`folder_paths` keys (None: no containment check)
    include: tuple[str, ...] = ()           # globs that override the secret patterns
    exclude: tuple[str, ...] = ()           # globs added to them

    def refusal(self, uri: str) -> str | None:
        """Why ``uri`` may not be sent, or ``None`` when it may."""
        where = _split(uri)
        if where is None:
            scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
            return "not a file on disk" if scheme == "untitled" else f"a {scheme or 'scheme-less'}: URI, not a file"
        authority, path, real = where.authority, where.path, where.real
        if self.folders is not None and not any(_inside(authority, p, f) for f in self.folders for p in {path, real}):
            return "outside the workspace folders"
        if self.include and _matches(path, self.include) and _matches(real, self.include):
            return None
        if is_secret_path(path, self.exclude) or is_secret_path(real, self.exclude):
            return "matches a secret-file pattern" + ("" if real == path else f" (it links to {real})")
        if self.folders is not None and real != path and not any(_inside(authority, real, f) for f in self.folders):
            return f"a link to a file outside the workspace folders ({real})"
        return None

    def allows(self, uri: str) -> bool:
        """Whether ``uri``'s text may be sent as context."""
        return self.refusal(uri) is None

    def may_complete(self, uri: str) -> bool:
        """Whether text around a cursor in ``uri`` may be sent: :meth:`allows`, or ``untitled:``."""
        return uri.lower().startswith("untitled:") or self.allows(uri)


def _inside(authority: str, path: str, folder: str) -> bool:
    """Whether ``path`` on ``authority`` is inside ``folder`` (a :func:`folder_paths` key)."""
    where, _, root = folder.rpartition("|")
    if where != authority:
        return False
    return path == root or path.startswith(root.rstrip("/") + "/")


def folder_paths(uris: Sequence[str]) -> tuple[str, ...]:
    """Workspace folders as ``authority|path`` keys (local ones' real paths too); others dropped."""
    keys: list[str] = []
    for uri in uris:
        where = _split(uri)
        if where is None:
            continue
        keys += [f"{where.authority}|{p}" for p in dict.fromkeys((where.path, where.real))]
    return tuple(keys)


class SecretDocument(BadRequest):
    """A request for a document that must not leave the machine."""

    code = "secret_document"


def outbound(req: CompletionRequest, *, send_untitled: bool = False) -> CompletionRequest:
    """``req`` as it may leave the machine: secret or unknown-scheme context dropped, secrets
    redacted, paths relative to their project. Raises :class:`SecretDocument` for such a document
    itself, or an untitled buffer unless ``send_untitled``."""
    why = _outbound_refusal(req.uri, send_untitled)
    if why is not None:
        raise SecretDocument(f"this document {why}; it is not sent to the remote backend",
                             hint="rename it, or complete it with the local backend"
                             + ("" if send_untitled else " (untitled buffers: backend.send_untitled)"))
    context = tuple(chunk for chunk in req.context if _outbound_refusal(chunk.uri, send_untitled) is None)
    clean, _withheld = redact_request(dataclasses.replace(req, context=context))
    return dataclasses.replace(clean, uri=_project_relative(req.uri),
                               context=tuple(dataclasses.replace(c, uri=_project_relative(c.uri)) for c in clean.context))


def redact_request(req: CompletionRequest) -> tuple[CompletionRequest, tuple[str, ...]]:
    """``req`` with its texts' secrets replaced (scanned as sent), and what was withheld
    (``"notes.py: Private Key"``); URIs stay."""
    withheld: list[str] = []
    name = _base(req.uri)
    before, after = redact_around(req.prefix, req.suffix, name)
    withheld += [f"{name}: {kind}" for kind in (*before.kinds, *after.kinds)]
    by_file: dict[str, list[int]] = {}
    for i, chunk in enumerate(req.context):
        by_file.setdefault(chunk.uri, []).append(i)
    texts: list[str] = [c.text for c in req.context]
    for uri, at in by_file.items():
        for i, found in zip(at, redact_chunks([texts[i] for i in at], _base(uri))):
            texts[i] = found.text
            withheld += [f"{_base(uri)}: {kind}" for kind in found.kinds]
    if not withheld:
        return req, ()
    context: tuple[ContextChunk, ...] = tuple(dataclasses.replace(c, text=t) for c, t in zip(req.context, texts))
    return dataclasses.replace(req, prefix=before.text, suffix=after.text, context=context), tuple(withheld)


def _outbound_refusal(uri: str, send_untitled: bool) -> str | None:
    if uri.lower().startswith("untitled:"):
        # "untitled:" alone: a client that names no document (the API); an editor's buffer has a name
        return None if send_untitled or uri.lower() == "untitled:" else "is an untitled buffer"
    where = _split(uri)
    if where is None:
        return "is not a file (unknown URI scheme)"
    if is_secret_path(where.path) or is_secret_path(where.real):
        return "matches a secret-file pattern"
    return None


def _base(uri: str) -> str:
    return posixpath.basename(urllib.parse.urlsplit(uri).path) or "document"


@functools.lru_cache(maxsize=4096)
def _project_root(folder: str) -> str:
    """The nearest directory from local ``folder`` up holding ``.git``, ``.hg`` or ``.svn``, else ``folder``."""
    probe = folder
    while probe not in ("", "/"):
        if any(os.path.exists(os.path.join(probe, marker)) for marker in (".git", ".hg", ".svn")):
            return probe
        probe = posixpath.dirname(probe)
    return folder


def _project_relative(uri: str) -> str:
    """``uri``'s path below its project's root (:func:`_project_root`; a remote file: its own
    directory); an untitled URI as is."""
    where = _split(uri)
    if where is None:
        return uri
    folder = posixpath.dirname(where.path)
    return posixpath.relpath(where.path, _project_root(folder) if where.scheme == "file" else folder)
