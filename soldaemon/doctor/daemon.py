"""``soldaemon doctor``'s daemon line (the running daemon, probed with its token).
No torch, no websockets server."""

from __future__ import annotations

import json
from typing import Any

from soldaemon.doctor import line as _line
from soldaemon.doctor.readers import DaemonReading


def probe_running_daemon(config: Any, port: int | None) -> DaemonReading:
    """``GET /healthz`` of the daemon its record names, with its token. Without a record nothing
    is sent (whatever listens is not ours): the reading only says whether the port is free."""
    import urllib.error
    import urllib.request

    from soldaemon.config import load_config
    from soldaemon.discovery import find_daemon, record_path
    from soldaemon.errors import SolError, Unavailable

    try:
        config = config if config is not None else load_config()
        target = find_daemon(config.server.fallback())
    except (SolError, OSError) as exc:
        why = (f"no live daemon record at {record_path()}" if isinstance(exc, Unavailable)
               else getattr(exc, "message", str(exc)))
        ports = dict.fromkeys(p for p in (config.server.port if config is not None else None, port) if p is not None)
        return DaemonReading("", False, None, why + "".join(_port_note(p) for p in ports))
    url = "http" + target.url[2:].rstrip("/") + "/healthz"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {target.token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=2.0) as resp:
            return DaemonReading(url, True, int(resp.status), resp.read(65536).decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return DaemonReading(url, True, int(exc.code), exc.read(65536).decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return DaemonReading(url, False, None, str(getattr(exc, "reason", exc))[:200])


def _port_note(port: int) -> str:
    """``; port N is held by another program`` when a loopback bind fails, else ``""``."""
    import socket

    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    except OSError:
        return f"; port {port} is held by another program (ss -ltnp 'sport = :{port}')"
    return ""


def served_health(d: DaemonReading | None) -> dict[str, Any] | None:
    """The running daemon's health document, when the probe got one (HTTP 200 or 503)."""
    if d is None or not d.reachable or d.status not in (200, 503):
        return None
    try:
        doc = json.loads(d.detail)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "daemon" in doc else None


def daemon_report(d: DaemonReading) -> dict[str, Any]:
    """The ``daemon`` line: verdict, detail, cost, fix."""
    if not d.reachable:
        return _line("info", f"no daemon answering at {d.url} ({d.detail})" if d.url
                     else f"no daemon answering ({d.detail})")
    health = served_health(d)
    if health is not None and "state" in health:
        proc = health.get("process") or {}
        return _line("ok", f"soldaemon {health.get('daemon')} {health.get('state')} at {d.url} "
                     f"(pid {proc.get('pid', '?')}, model {health.get('model')} on {health.get('device')})")
    if d.status == 401:
        return _line("warn", f"{d.url} answered 401: a soldaemon runs but refused the token read "
                     "from the state directory", cost="editors cannot connect with that token",
                     fix="soldaemon stop, then start it again (or check server.token_file)")
    if d.status == 200:
        return _line("ok", f"daemon answering at {d.url}")
    return _line("warn", f"{d.url} answered HTTP {d.status}: another program may hold the port",
                 cost="the daemon cannot listen on this port",
                 fix=f"ss -ltnp 'sport = :{d.url.rsplit(':', 1)[1].split('/')[0]}'")
