"""The walk of one completion request through the daemon's modules.

Loads the local engine on the tiny model (built in code, no download), sends
two completions (a cold one, then one typed through), and records which of
the project's modules each request enters, in order: a module is "entered"
when a call crosses from another project module into it. Prints, per request,
the modules in order, how often each was entered, and how many entries went
back to a module already left.

    python scripts/request_walk.py [--json FILE]

Used as evidence for the architecture (docs/architecture.md): the number of
re-entries is a measure of how tangled one request's path is.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PACKAGES = ("soldaemon", "lsp")


def _module_of(frame: FrameType) -> str | None:
    """The project module ``frame`` runs in; None outside the project and
    for code no file holds (a dataclass's generated ``__init__``: building
    a record is not a step a reader follows)."""
    if frame.f_code.co_filename.startswith("<"):
        return None
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or name.split(".")[0] not in PACKAGES:
        return None
    return name


class Walk:
    """Records module entries while active (``sys.setprofile``)."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.calls: list[tuple[str | None, str]] = []     # (from, into) of each entry

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        here = _module_of(frame)
        if here is None:
            return
        caller = frame.f_back
        while caller is not None and _module_of(caller) is None and caller.f_back is not None:
            # Calls through the standard library or torch (e.g. a generator
            # driven by a for loop in a project module) count from the project
            # module below them.
            caller = caller.f_back
        came_from = _module_of(caller) if caller is not None else None
        if came_from != here:
            self.entered.append(here)
            self.calls.append((came_from, here))

    def __enter__(self) -> Walk:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


PACKAGES_AS_ONE = ("soldaemon.fim", "soldaemon.pipeline", "soldaemon.config", "soldaemon.remote", "soldaemon.server")


def coarse(module: str) -> str | None:
    """The stage-level name of ``module``, or None to leave it out: the
    engine's mechanism and the policy it consults (backend, kernels, session,
    sampling, draft length, ...) below the engine's entry point are one box;
    a package split by concern counts as the module it was; the API's data
    types are left out (building a Delta is not a stage). What is left is how
    the stages hand one request to each other."""
    if module == "soldaemon.api":
        return None
    if (module.startswith(("soldaemon.runtime.", "soldaemon.policy.")) and module != "soldaemon.runtime.engine.local"):
        return "soldaemon.runtime.* + policy.*"
    for package in PACKAGES_AS_ONE:
        if module == package or module.startswith(package + "."):
            return package
    return module


def collapse(entered: list[str]) -> list[str]:
    out: list[str] = []
    for m in map(coarse, entered):
        if m is not None and (not out or out[-1] != m):
            out.append(m)
    return out


def as_read(calls: list[tuple[str | None, str]], level: Any = lambda m: m) -> dict[str, int]:
    """The walk as a reader follows the code: each call from one module into
    another counted once (a loop's body is read once, not once per token),
    at the granularity ``level`` gives. ``stops``: distinct calls;
    ``returns``: those into a module the walk had already left when the
    call was first made."""
    seen: set[tuple[str, str]] = set()
    left: set[str] = set()
    stops = returns = 0
    previous: str | None = None
    for came_from, into in calls:
        a, b = level(came_from) if came_from else None, level(into)
        if b is None or a == b:
            continue
        if previous is not None and previous != b:
            left.add(previous)
        previous = b
        if a is None or (a, b) in seen:
            continue
        seen.add((a, b))
        stops += 1
        returns += b in left
    return {"stops": stops, "returns": returns}


def summarize(entered: list[str]) -> dict[str, Any]:
    order: list[str] = []
    for m in entered:
        if m not in order:
            order.append(m)
    left: set[str] = set()
    returns = 0
    previous: str | None = None
    for m in entered:
        if previous is not None and previous != m:
            left.add(previous)
        if m in left:
            returns += 1
        previous = m
    summary = {"entries": len(entered), "modules": order, "per_module": dict(Counter(entered).most_common()),
               "returns_to_a_module_left": returns}
    if entered and any(coarse(m) != m for m in entered):
        summary["stages"] = summarize(collapse(entered))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the walk as JSON here")
    args = ap.parse_args(argv)

    from soldaemon.api import CancelToken, CompletionRequest, Done
    from soldaemon.config import config_from_dict
    from soldaemon.runtime.engine.local import load_engine
    from soldaemon_bench.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        config = config_from_dict({"model": {"path": str(model), "precision": "float32"},
                                   "device": {"device": "cpu"}})
        engine = load_engine(config, progress=False)
        prefix = "def add(a, b):\n    return "
        cold = CompletionRequest(id="walk-1", prefix=prefix, suffix="\n", max_tokens=8, uri="file:///w.py")
        report: dict[str, Any] = {}
        shown = ""
        with Walk() as walk:
            for event in engine.complete(cold, CancelToken()):
                if isinstance(event, Done) and event.items:
                    shown = event.items[0]
        report["cold"] = summarize(walk.entered)
        report["cold"]["as_read"] = as_read(walk.calls)
        report["cold"]["as_read_stages"] = as_read(walk.calls, coarse)
        # The user types the first character of what was shown: answered from
        # what the engine remembers (type-through), no model call.
        typed = CompletionRequest(id="walk-2", prefix=prefix + shown[:1], suffix="\n", max_tokens=8,
                                  uri="file:///w.py")
        with Walk() as walk:
            for _event in engine.complete(typed, CancelToken()):
                pass
        label = "typed-through" if shown else "second"
        report[label] = summarize(walk.entered)
        report[label]["as_read"] = as_read(walk.calls)
        report[label]["as_read_stages"] = as_read(walk.calls, coarse)
        engine.close()

    for label, s in report.items():
        print(f"== {label}: {s['entries']} module entries, {s['returns_to_a_module_left']} back to a module left")
        print("   order: " + " -> ".join(m.removeprefix("soldaemon.") for m in s["modules"]))
        print("   entries: " + ", ".join(f"{m.removeprefix('soldaemon.')} {n}" for m, n in s["per_module"].items()))
        r, rs = s["as_read"], s["as_read_stages"]
        print(f"   as read (each call between two modules once): {r['stops']} calls, {r['returns']} back "
              f"to a module left; stage level {rs['stops']} calls, {rs['returns']} back")
        if "stages" in s:
            st = s["stages"]
            print(f"   stage level: {st['entries']} entries, "
                  f"{st['returns_to_a_module_left']} back to a module left")
            print("   entries: " + ", ".join(f"{m.removeprefix('soldaemon.')} {n}" for m, n in st["per_module"].items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
