"""A remote engine over plain ``http://`` on another host (issue 57,
finding 9): the API key and every prompt would cross the network in clear
text, so it is refused unless ``backend.allow_insecure: true``."""

from __future__ import annotations

from typing import Any

import pytest

from soldaemon.config import config_from_dict
from soldaemon.errors import ConfigError
from soldaemon.remote.engine import RemoteEngine


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    from soldaemon_bench.tiny import build_tokenizer

    return build_tokenizer()


def _engine(tokenizer: Any, url: str, **backend: Any) -> RemoteEngine:
    return RemoteEngine(config_from_dict({"backend": {"kind": "remote", "url": url, **backend}}), tokenizer, "tiny")


@pytest.mark.parametrize("url", ["http://203.0.113.7:8080/v1", "http://gpu-box.lan:8000", "http://[2001:db8::1]:80"])
def test_plain_http_to_another_host_is_refused(tiny_tokenizer: Any, url: str) -> None:
    with pytest.raises(ConfigError, match="clear text") as info:
        _engine(tiny_tokenizer, url)
    assert "allow_insecure" in (info.value.hint or "")
    assert _engine(tiny_tokenizer, url, allow_insecure=True).endpoint.host


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:8080/v1", "http://[::1]:8080",
                                 "https://203.0.113.7:8443"])
def test_loopback_or_tls_is_accepted(tiny_tokenizer: Any, url: str) -> None:
    assert _engine(tiny_tokenizer, url).endpoint.host
