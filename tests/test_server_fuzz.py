"""Fuzz a real daemon: 10,000+ generated malformed or hostile frames over
four concurrent connections. Every frame is answered exactly as the spec
says (the expected answer comes from the pure decoder plus the documented
connection rules); afterwards the daemon still serves a valid completion and
holds no work."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections import Counter
from typing import Any, Iterator

import pytest

from soldaemon.errors import ProtocolError
from soldaemon.protocol import (Cancel, Complete, CompletionEvent, Debug, Health, Limits, Warm, decode_client,
                                encode_client)
from tests.fixtures.daemon import Daemon, complete, spawn

MESSAGES_PER_CONNECTION = 2_600
CONNECTIONS = 4
BATCH = 100
DOCUMENTED_CODES = {"bad_utf8", "bad_json", "bad_field", "too_large", "unknown_type", "unsupported_version",
                    "unknown_id", "duplicate_id", "busy", "bad_request"}

BAD_ESCAPES = ["\\ud800", "\\udfff", "a\\ud83d", "\\x41", "\\u12"]
TYPES = ["complete", "warm", "cancel", "event", "health", "debug"]
FIELDS = ["id", "prefix", "suffix", "uri", "version", "language", "context", "max_tokens", "budget_ms",
          "multiline", "priority", "temperature", "top_p", "n", "seed", "kind", "item", "accepted_chars",
          "parts", "v", "type"]


class Hostile:
    """Generates one frame at a time; ``valid_every`` in 50 is a valid but
    strange complete/warm (which really runs)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0
        self.seed = seed

    def text(self, limit: int = 40) -> str:
        r = self.rng
        alphabet = ["a", "é", "漢", "🙂", "\u202e", "\x00", "\n", "\"", "\\", "\ufeff", "\U0010ffff", " ", "{", "}"]
        return "".join(r.choice(alphabet) for _ in range(r.randint(0, limit)))

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        makers = [
            lambda: None, lambda: True, lambda: False, lambda: r.randint(-2**70, 2**70),
            lambda: r.random() * 1e6, lambda: -1, lambda: 0, self.text,
            lambda: "x" * r.choice([129, 4097, 70_000]),
            lambda: r.choice(["", "auto", "single", "high", "heatmap", "shown"]),
            lambda: r.choice([1e308, -0.0, 2**63, 2**64]),
        ]
        if depth < 2:
            makers += [
                lambda: [self.value(depth + 1) for _ in range(r.randint(0, 3))],
                lambda: {self.text(5): self.value(depth + 1) for _ in range(r.randint(0, 3))},
                lambda: [{"uri": self.value(depth + 1), "text": self.value(depth + 1)}],
            ]
        return r.choice(makers)()

    def base(self) -> dict[str, Any]:
        r = self.rng
        kind = r.choice(TYPES)
        obj: dict[str, Any] = {"type": kind, "id": f"f{self.seed}-{self.n}"}
        if kind in ("complete", "warm"):
            obj.update(prefix=self.text(), suffix=self.text(), max_tokens=r.randint(1, 2))
        if kind == "event":
            obj["kind"] = r.choice(["shown", "accepted", "partial", "rejected"])
        return obj

    def frame(self) -> str | bytes:
        """The next frame. A frame that happens to decode into a valid
        complete/warm is re-issued with a fresh id and at most 3 tokens, so
        ids of running requests are unique and the worker is not clogged."""
        data = self._frame()
        try:
            msg = decode_client(data)
        except ProtocolError:
            return data
        if isinstance(msg, (Complete, Warm)) and not msg.request.id.startswith(f"c{self.seed}-"):
            req = dataclasses.replace(msg.request, id=f"c{self.seed}-{self.n}",
                                      max_tokens=min(3, msg.request.max_tokens))
            return encode_client(type(msg)(req))
        return data

    def _frame(self) -> str | bytes:
        self.n += 1
        r = self.rng
        choice = r.randint(0, 15)
        if choice == 0:  # random bytes
            return bytes(r.randint(0, 255) for _ in range(r.randint(0, 64)))
        if choice == 1:  # invalid UTF-8 inside JSON
            raw = json.dumps(self.base()).encode()
            cut = r.randint(0, len(raw))
            return raw[:cut] + r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]) + raw[cut:]
        if choice == 2:  # JSON that is not an object
            return json.dumps(self.value())
        if choice == 3:  # truncated
            raw = json.dumps(self.base())
            return raw[: r.randint(0, len(raw) - 1)]
        if choice == 4:  # a wrong or missing type
            obj = self.base()
            obj["type"] = r.choice([self.value(), self.text(8), "COMPLETE", "complete ", None])
            if r.random() < 0.2:
                del obj["type"]
            return json.dumps(obj)
        if choice == 5:  # deep nesting
            depth = r.choice([500, 5_000, 50_000])
            return "[" * depth + "]" * r.choice([0, depth])
        if choice == 6:  # non-JSON constants and huge numbers
            obj = self.base()
            raw = json.dumps(obj)[:-1]
            constant = r.choice(["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000])
            return raw + f', "{r.choice(FIELDS)}": {constant}}}'
        if choice == 7:  # lone surrogates and bad escapes
            obj = self.base()
            raw = json.dumps(obj)[:-1]
            escape = r.choice(BAD_ESCAPES)
            return raw + f', "{r.choice(["id", "prefix", "uri", "language"])}": "{escape}"}}'
        if choice == 8:  # cancel for an unknown id
            return json.dumps({"type": "cancel", "id": r.choice([f"nobody-{self.n}", self.text(10) or "z"])})
        if choice == 9:  # bad versions
            obj = self.base()
            obj["v"] = r.choice([0, 2, "1", 1.0, True, None, [1]])
            return json.dumps(obj)
        if choice == 10:  # oversized fields (frames stay under the 1 MiB frame limit)
            obj = self.base()
            obj[r.choice(["id", "uri", "language", "prefix"])] = "y" * r.choice([129, 4097, 65, 1_000_001])
            return json.dumps(obj)
        if choice == 11:  # valid but strange: really runs
            if r.random() < 0.3:
                obj = {"type": r.choice(["complete", "warm"]), "id": f"c{self.seed}-{self.n}",
                       "prefix": self.text(60), "suffix": self.text(20), "uri": f"file:///fuzz{r.randint(0, 3)}",
                       "max_tokens": r.randint(1, 3), "context": [{"uri": "u", "text": self.text(30)}],
                       "extra_unknown_field": self.value()}
                return json.dumps(obj, ensure_ascii=r.random() < 0.5)
            return json.dumps({"type": r.choice(["health", "debug", "event"]), "id": f"f{self.seed}-{self.n}",
                               "kind": "shown", "junk": self.value()})
        # 12–15: a known type with one to three fields replaced by random values
        obj = self.base()
        for _ in range(r.randint(1, 3)):
            obj[r.choice(FIELDS)] = self.value()
        return json.dumps(obj, ensure_ascii=r.random() < 0.5)


def expected_answer(data: str | bytes, limits: Limits) -> tuple[str, str, str | None] | None:
    """What the spec says comes back synchronously: ("error", code, id),
    ("status", kind, id), ("run", "", id) for a request that runs, or None."""
    try:
        msg = decode_client(data, limits)
    except ProtocolError as exc:
        return ("error", exc.code, exc.request_id)
    if isinstance(msg, Cancel):
        return ("error", "unknown_id", msg.id)
    if isinstance(msg, Health):
        return ("status", "health", msg.id)
    if isinstance(msg, Debug):
        return ("status", "debug", msg.id)
    if isinstance(msg, CompletionEvent):
        return None
    assert isinstance(msg, (Complete, Warm))
    return ("run", "", msg.request.id)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[Daemon]:
    d = spawn(tmp_path_factory.mktemp("fuzz"), args=[*engine_args, "--log-level", "warning"],
              server={"rate_limit_per_s": 1_000_000})
    assert isinstance(d, Daemon)
    yield d
    d.stop()


async def fuzz_connection(daemon: Daemon, seed: int, tally: Counter[str]) -> None:
    gen = Hostile(seed)
    limits = Limits(max_message_bytes=1_048_576)
    async with await daemon.connect() as ws:
        running: set[str] = set()
        sent = 0
        while sent < MESSAGES_PER_CONNECTION:
            batch = [gen.frame() for _ in range(BATCH)]
            expected = [expected_answer(f, limits) for f in batch]
            for f in batch:
                if isinstance(f, bytes):
                    await ws.send(f, text=True)
                else:
                    await ws.send(f)
            sent += len(batch)
            for e in expected:
                if e is not None and e[0] == "run":
                    running.add(e[2] or "")
            sync = [e for e in expected if e is not None and e[0] != "run"]
            got: list[tuple[str, str, str | None]] = []
            async with asyncio.timeout(60):
                while len(got) < len(sync):
                    frame = json.loads(await ws.recv())
                    if frame.get("id") in running:  # a real request's stream or end
                        if frame["type"] in ("done", "error"):
                            running.discard(frame["id"])
                            tally["ran:" + frame.get("finish_reason", frame.get("code", ""))] += 1
                        continue
                    kind = frame["type"]
                    got.append((kind, frame["code"] if kind == "error" else frame["kind"], frame.get("id")))
                    if kind == "error":
                        assert frame["code"] in DOCUMENTED_CODES, frame
                        assert "Traceback" not in frame["message"]
            assert got == sync, next((g, s) for g, s in zip(got, sync) if g != s)
            for kind, code, _ in got:
                tally[f"{kind}:{code}"] += 1
            tally["frames"] += len(batch)
        async with asyncio.timeout(60):  # every request that ran ends
            while running:
                frame = json.loads(await ws.recv())
                if frame.get("id") in running and frame["type"] in ("done", "error"):
                    running.discard(frame["id"])
                    tally["ran:" + frame.get("finish_reason", frame.get("code", ""))] += 1


@pytest.mark.asyncio
async def test_fuzz_every_frame_answered_per_spec_and_the_daemon_lives(daemon: Daemon) -> None:
    tally: Counter[str] = Counter()
    t0 = time.perf_counter()
    await asyncio.gather(*(fuzz_connection(daemon, seed, tally) for seed in range(CONNECTIONS)))
    elapsed = time.perf_counter() - t0
    print(f"\n[figure] fuzz: {tally['frames']} frames in {elapsed:.1f} s; answers: "
          + ", ".join(f"{k}={v}" for k, v in sorted(tally.items()) if k != "frames"))
    assert tally["frames"] >= 10_000
    assert daemon.proc.poll() is None
    async with await daemon.connect() as ws:
        deltas, end = await complete(ws, "after-fuzz", max_tokens=4)
        assert type(end).__name__ == "Done" and end.finish_reason in ("stop", "length"), end
    health = daemon.health()
    assert health["state"] == "ready"
    assert health["load"]["in_flight"] == 0 and health["load"]["queue_depth"] == 0
    assert "Traceback" not in daemon.stderr()


@pytest.mark.asyncio
async def test_many_connections_are_capped_and_the_daemon_lives(daemon: Daemon) -> None:
    """64 connections are served; the 65th is refused with 503 at the
    handshake (no websocket, no state); once one closes, a new one gets in."""
    from websockets.exceptions import InvalidStatus

    conns = []
    try:
        for _ in range(64):
            conns.append(await daemon.connect())
        with pytest.raises(InvalidStatus) as refused:
            await daemon.connect()
        assert refused.value.response.status_code == 503
        await conns.pop().close()
        deadline = time.monotonic() + 10
        while daemon.health()["load"]["connections"] >= 64 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        conns.append(await daemon.connect())
        _, done = await complete(conns[-1], "after-cap", max_tokens=2)
        assert type(done).__name__ == "Done"
    finally:
        for ws in conns:
            await ws.close()
