"""The pure wire protocol: every documented code for every kind of bad input,
round trips, and a property test that decoding never raises anything but a
ProtocolError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soldaemon.api import CompletionRequest, ContextChunk, Delta, Done, Timings
from soldaemon.errors import BadRequest, Busy, ProtocolError, RateLimited, SolError
from soldaemon.protocol import (PROTOCOL_VERSION, Cancel, Complete, CompletionEvent, Debug, ErrorFrame, Health, Limits,
                                Status, Warm, decode_client, decode_server, encode_client, encode_server, error_frame)


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def code_of(data: bytes | str, limits: Limits = Limits()) -> tuple[str, str | None]:
    with pytest.raises(ProtocolError) as info:
        decode_client(data, limits)
    return info.value.code, info.value.request_id


def test_complete_minimal_gets_defaults() -> None:
    msg = decode_client(frame(type="complete", id="a", prefix="def f(", suffix=")"))
    assert msg == Complete(CompletionRequest(id="a", prefix="def f(", suffix=")"))


def test_complete_all_fields() -> None:
    msg = decode_client(frame(
        type="complete", v=1, id="r1", prefix="p", suffix="s", uri="file:///a.py", version=7,
        language="python", context=[{"uri": "file:///b.py", "text": "import os"}],
        max_tokens=32, budget_ms=250, multiline="single", priority="high",
        temperature=0.8, top_p=0.9, n=3, seed=42, some_future_field={"x": 1},
    ))
    assert isinstance(msg, Complete)
    req = msg.request
    assert req.context == (ContextChunk("file:///b.py", "import os"),)
    assert (req.max_tokens, req.budget_ms, req.multiline, req.priority) == (32, 250.0, "single", "high")
    assert (req.n, req.seed, req.version, req.language) == (3, 42, 7, "python")


def test_other_client_messages() -> None:
    assert decode_client(frame(type="warm", id="w", prefix="x")) == Warm(CompletionRequest(id="w", prefix="x", suffix=""))
    assert decode_client(frame(type="cancel", id="a")) == Cancel("a")
    assert decode_client(frame(type="event", id="a", kind="partial", accepted_chars=3)) == \
        CompletionEvent("a", "partial", 0, 3)
    assert decode_client(frame(type="health")) == Health(None)
    assert decode_client(frame(type="health", id="h")) == Health("h")
    assert decode_client(frame(type="debug", parts=["prefetch"])) == Debug(None, ("prefetch",))
    assert decode_client(frame(type="debug", id="d")) == Debug("d", ("heatmap", "prefetch"))


def test_bytes_and_str_are_the_same() -> None:
    text = frame(type="complete", id="é", prefix="naïve ", suffix="")
    assert decode_client(text) == decode_client(text.encode("utf-8"))


@pytest.mark.parametrize("data, code", [
    (b"\xff\xfe{}", "bad_utf8"),
    (b'{"type":"complete","id":"a","prefix":"\xc3"}', "bad_utf8"),
    ("{", "bad_json"),
    ("", "bad_json"),
    ("[1, 2]", "bad_json"),
    ('"complete"', "bad_json"),
    ('{"type":"complete","id":"a","prefix":"x","budget_ms":NaN}', "bad_json"),
    ('{"type":"complete","id":"a","prefix":"x","max_tokens":Infinity}', "bad_json"),
    ("[" * 3000 + "]" * 3000, "bad_json"),
    ('{"type":"complete","id":"a","prefix":"x","max_tokens":' + "9" * 5000 + "}", "bad_json"),
    (frame(id="a"), "bad_field"),
    (frame(type=3), "bad_field"),
    (frame(type="explode"), "unknown_type"),
    (frame(type="complete", v=2, id="a", prefix=""), "unsupported_version"),
    (frame(type="complete", v="1", id="a", prefix=""), "unsupported_version"),
    (frame(type="complete", v=True, id="a", prefix=""), "unsupported_version"),
    (frame(type="complete", prefix="x"), "bad_field"),
    (frame(type="complete", id="", prefix="x"), "bad_field"),
    (frame(type="complete", id=5, prefix="x"), "bad_field"),
    (frame(type="complete", id="a"), "bad_field"),
    (frame(type="complete", id="a", prefix=None), "bad_field"),
    (frame(type="complete", id="a", prefix="x", suffix=["no"]), "bad_field"),
    (frame(type="complete", id="a", prefix="x", max_tokens=True), "bad_field"),
    (frame(type="complete", id="a", prefix="x", max_tokens=4.0), "bad_field"),
    (frame(type="complete", id="a", prefix="x", max_tokens=0), "bad_field"),
    (frame(type="complete", id="a", prefix="x", max_tokens=10**9), "bad_field"),
    (frame(type="complete", id="a", prefix="x", budget_ms=-1), "bad_field"),
    (frame(type="complete", id="a", prefix="x", multiline="maybe"), "bad_field"),
    (frame(type="complete", id="a", prefix="x", priority="urgent"), "bad_field"),
    (frame(type="complete", id="a", prefix="x", n=2), "bad_field"),
    (frame(type="complete", id="a", prefix="x", top_p=0), "bad_field"),
    (frame(type="complete", id="a", prefix="x", version="7"), "bad_field"),
    (frame(type="complete", id="a", prefix="x", context="text"), "bad_field"),
    (frame(type="complete", id="a", prefix="x", context=[1]), "bad_field"),
    (frame(type="complete", id="a", prefix="x", context=[{"uri": "u"}]), "bad_field"),
    (frame(type="complete", id="a", prefix="x\ud800"), "bad_field"),
    (frame(type="complete", id="a", prefix="x" * 1001), "too_large"),
    (frame(type="complete", id="a" * 129, prefix="x"), "too_large"),
    (frame(type="complete", id="a", prefix="x", uri="u" * 5000), "too_large"),
    (frame(type="complete", id="a", prefix="x", context=[{"uri": "u", "text": "t"}] * 33), "too_large"),
    (frame(type="cancel"), "bad_field"),
    (frame(type="cancel", id=["a"]), "bad_field"),
    (frame(type="event", id="a", kind="liked"), "bad_field"),
    (frame(type="event", id="a"), "bad_field"),
    (frame(type="debug", parts=["heatmap", "secrets"]), "bad_field"),
    (frame(type="debug", parts="heatmap"), "bad_field"),
    (frame(type="health", id=""), "bad_field"),
    ("x" * 9000, "too_large"),
])
def test_bad_input_has_a_stable_code(data: bytes | str, code: str) -> None:
    assert code_of(data, Limits(max_text_chars=1000, max_message_bytes=8192))[0] == code


def test_error_carries_the_request_id_when_readable() -> None:
    assert code_of(frame(type="complete", id="r7", prefix="x", max_tokens=-1)) == ("bad_field", "r7")
    assert code_of(frame(type="complete", id=7, prefix="x")) == ("bad_field", None)
    assert code_of(frame(type="nope", id="z")) == ("unknown_type", "z")


def test_protocol_errors_are_bad_requests_and_rate_limit_is_busy() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client("{")
    assert isinstance(info.value, BadRequest) and isinstance(info.value, SolError)
    assert isinstance(RateLimited("x"), Busy) and RateLimited("x").retryable


def test_error_frame_mapping_hides_internal_details() -> None:
    assert error_frame(RuntimeError("secret path /home/x")) == \
        ErrorFrame(None, "internal", "internal error; see the daemon log", False, None)
    mapped = error_frame(RateLimited("slow down", hint="wait"), "q")
    assert mapped == ErrorFrame("q", "rate_limited", "slow down", True, "wait")
    with pytest.raises(ProtocolError) as info:
        decode_client(frame(type="zap", id="k"))
    assert error_frame(info.value).id == "k"


def test_client_round_trip() -> None:
    req = CompletionRequest(id="r", prefix="a", suffix="b", uri="file:///x", version=3, language="go",
                            context=(ContextChunk("u", "t"),), max_tokens=9, budget_ms=100.0,
                            multiline="multi", priority="high", temperature=0.5, top_p=0.5, n=2, seed=1)
    for msg in (Complete(req), Warm(req), Cancel("r"), CompletionEvent("r", "accepted"),
                CompletionEvent("r", "partial", 1, 4), Health(), Health("h"), Debug("d", ("heatmap",))):
        text = encode_client(msg)
        assert json.loads(text)["v"] == PROTOCOL_VERSION
        assert decode_client(text) == msg


def test_server_round_trip() -> None:
    timings = Timings(queue_ms=1.25, prefill_ms=3.5, ttft_ms=5.0, decode_ms=10.0, total_ms=16.0,
                      prompt_tokens=20, cached_tokens=12, generated_tokens=4,
                      ttft_start_ns=1_700_000_000_000_000_000, ttft_end_ns=1_700_000_000_005_000_000)
    for msg in (Delta("a", "ü€𝄞"), Done("a", ("x", "y"), "superseded", timings),
                ErrorFrame("a", "bad_field", "m", False, "h"), ErrorFrame(None, "busy", "m", True),
                Status("health", {"state": "ready", "uptime_s": 1.5}, "h")):
        assert decode_server(encode_server(msg)) == msg


def test_done_frame_shape() -> None:
    obj = json.loads(encode_server(Done("a", ("x",), "stop", Timings(ttft_ms=1.23456))))
    assert obj["type"] == "done" and obj["finish_reason"] == "stop" and obj["items"] == ["x"]
    assert obj["timings"]["ttft_ms"] == 1.235
    for key in ("queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "prompt_tokens", "cached_tokens",
                "generated_tokens", "ttft_start_ns", "ttft_end_ns"):
        assert key in obj["timings"]


def test_status_frame_shape() -> None:
    obj = json.loads(encode_server(Status("hello", {"protocol": 1})))
    assert obj == {"type": "status", "kind": "hello", "protocol": 1}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
message_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["complete", "warm", "cancel", "event", "health", "debug", "x"])},
    optional={"id": json_values, "prefix": json_values, "suffix": json_values, "max_tokens": json_values,
              "context": json_values, "kind": json_values, "parts": json_values, "v": json_values,
              "n": json_values, "temperature": json_values, "budget_ms": json_values},
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200) | json_values.map(json.dumps) | message_like.map(json.dumps))
def test_decode_never_raises_anything_else(data: bytes | str) -> None:
    try:
        msg = decode_client(data, Limits(max_message_bytes=1024))
    except ProtocolError as exc:
        assert exc.code in {"bad_utf8", "bad_json", "bad_field", "too_large", "unknown_type",
                            "unsupported_version"}
        assert error_frame(exc).code == exc.code
        encode_server(error_frame(exc))  # always encodable
    else:
        assert isinstance(msg, (Complete, Warm, Cancel, CompletionEvent, Health, Debug))


def test_a_left_out_field_gets_the_daemons_completion_defaults() -> None:
    """A complete message without max_tokens, temperature, top_p, budget_ms
    or multiline gets the daemon's ``completion:`` settings (through
    ServerSettings), not constants of the protocol; a field it sends wins."""
    from soldaemon.config import config_from_dict
    from soldaemon.server.settings import ServerSettings

    config = config_from_dict({"completion": {"max_tokens": 96, "temperature": 0.5, "top_p": 0.9,
                                              "budget_ms": 700, "multiline": "single"}})
    limits = ServerSettings.from_config(config.server, config.completion).limits
    req = decode_client(frame(type="complete", id="a", prefix="x"), limits).request  # type: ignore[union-attr]
    assert (req.max_tokens, req.temperature, req.top_p, req.budget_ms, req.multiline) == (96, 0.5, 0.9, 700.0, "single")
    sent = decode_client(frame(type="complete", id="b", prefix="x", max_tokens=8, multiline="multi"), limits)
    assert (sent.request.max_tokens, sent.request.multiline) == (8, "multi")  # type: ignore[union-attr]
    # without a config: the defaults of config completion: as shipped
    shipped = config_from_dict({}).completion
    plain = decode_client(frame(type="complete", id="c", prefix="x")).request  # type: ignore[union-attr]
    assert (plain.max_tokens, plain.budget_ms, plain.multiline) == (shipped.max_tokens, shipped.budget_ms, shipped.multiline)
