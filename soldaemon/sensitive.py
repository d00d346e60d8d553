"""Which documents may be sent as model input: the secret-file rule.

One rule for every place text leaves an editor or the machine — sol-lsp's
context and completions (:mod:`lsp.context`, :mod:`lsp.completer`) and the
daemon's remote backend (:mod:`soldaemon.remote`): a document whose path
matches a secret pattern is never sent, and with workspace folders known, a
document outside all of them is not sent either.

Patterns are shell-style globs matched against every path component and
against the whole path (``fnmatch``, case-insensitive), so ``.env*`` matches
``/home/me/app/.env.local`` and ``.ssh`` any file under ``~/.ssh/``. The
include globs of a :class:`ContextPolicy` let through what the defaults
would refuse (``!.env.example`` style, written without the ``!``); its
exclude globs refuse more.

Contract: :func:`uri_path` and :meth:`ContextPolicy.allows` never raise;
a URI that is not a ``file:`` URI (``untitled:``, ``git:``, …) is refused.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import posixpath
import urllib.parse
from dataclasses import dataclass
from typing import Sequence

from soldaemon.api import CompletionRequest
from soldaemon.errors import BadRequest

# Files that hold credentials: dotenv files, keys and certificates, SSH and
# GPG homes, VCS internals, cloud and package-manager credential stores.
# SSH keys are named by key type (``id_rsa``, ``id_ed25519.pub``): a bare
# ``id_*`` would refuse ``id_utils.py``.
SECRET_PATTERNS: tuple[str, ...] = (
    ".env", ".env.*", "*.env", ".envrc",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "id_xmss*", "*.ppk", "known_hosts", "authorized_keys",
    ".ssh", ".gnupg", ".git", ".hg", ".svn", ".aws", ".azure", ".gcloud", ".kube", ".docker",
    ".netrc", "_netrc", ".npmrc", ".pypirc", ".pgpass", ".git-credentials", ".htpasswd",
    "credentials", "credentials.*", "*credentials*.json", "secrets.*", "*.secret", "*.secrets",
    "token", "*.token", "service-account*.json", "terraform.tfstate*", "*.tfvars",
)


def uri_path(uri: str) -> str | None:
    """The POSIX path of a ``file:`` URI, else ``None``."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme.lower() != "file":
        return None
    path = urllib.parse.unquote(parsed.path)
    return posixpath.normpath(path) if path.startswith("/") else None


def _matches(path: str, patterns: Sequence[str]) -> bool:
    lowered = path.lower()
    parts = [p for p in lowered.split("/") if p]
    for pattern in patterns:
        pat = pattern.lower().rstrip("/")
        if "/" in pat:
            if fnmatch.fnmatchcase(lowered, pat) or fnmatch.fnmatchcase(lowered, "*/" + pat.lstrip("/")):
                return True
        elif any(fnmatch.fnmatchcase(part, pat) for part in parts):
            return True
    return False


def is_secret_path(path: str, extra: Sequence[str] = ()) -> bool:
    """True when ``path`` (or a directory above it) matches a secret pattern."""
    return _matches(path, (*SECRET_PATTERNS, *extra))


@dataclass(frozen=True)
class ContextPolicy:
    """What may be sent. ``folders`` are the workspace folders' paths
    (``None``: the editor named none, no containment check; empty: every
    folder was closed, nothing is inside); ``include`` globs override the
    secret patterns, ``exclude`` globs add to them."""

    folders: tuple[str, ...] | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def refusal(self, uri: str) -> str | None:
        """Why ``uri`` may not be sent, or ``None`` when it may."""
        path = uri_path(uri)
        if path is None:
            return "not a file on disk"
        if self.folders is not None and not any(path == f or path.startswith(f.rstrip("/") + "/") for f in self.folders):
            return "outside the workspace folders"
        if self.include and _matches(path, self.include):
            return None
        if is_secret_path(path, self.exclude):
            return "matches a secret-file pattern"
        return None

    def allows(self, uri: str) -> bool:
        """May ``uri``'s text be sent as context?"""
        return self.refusal(uri) is None

    def may_complete(self, uri: str) -> bool:
        """May the text around a cursor in ``uri`` be sent? As
        :meth:`allows`, except that a buffer not on disk (``untitled:``)
        may be completed in (it is never sent as another file's context)."""
        return uri_path(uri) is None or self.allows(uri)


def folder_paths(uris: Sequence[str]) -> tuple[str, ...]:
    """Workspace folder URIs as paths (non-file folders are dropped)."""
    return tuple(p for p in (uri_path(u) for u in uris) if p is not None)


class SecretDocument(BadRequest):
    """A request for a document that must not leave the machine."""

    code = "secret_document"


def outbound(req: CompletionRequest) -> CompletionRequest:
    """``req`` as it may be sent off the machine (the remote backend): the
    context chunks of secret files dropped. Raises :class:`SecretDocument`
    when the document being completed is itself a secret file. The daemon
    knows no workspace folders, so only the secret patterns apply here
    (sol-lsp applies the folder rule before anything reaches the daemon)."""
    path = uri_path(req.uri)
    if path is not None and is_secret_path(path):
        raise SecretDocument("this document matches a secret-file pattern; it is not sent to the remote backend",
                             hint="rename it, or complete it with the local backend")
    kept = tuple(c for c in req.context if (p := uri_path(c.uri)) is None or not is_secret_path(p))
    return req if len(kept) == len(req.context) else dataclasses.replace(req, context=kept)
