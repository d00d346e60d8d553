"""Processes that convert the same model at once (issue 26, finding 5): one
converts, the others wait on the cache's lock and use its result. Before the
lock each converted, and the later ones failed on ``os.replace`` onto the
non-empty directory the first had moved there. Real processes; the GGUF is a
stand-in whose "reading" returns the tiny model after a pause, so the
conversions overlap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from soldaemon_bench.tiny import build_tiny_model

REPO = Path(__file__).resolve().parent.parent

CONVERT = """
import sys, time
from pathlib import Path
import transformers
from soldaemon.weights import loader

tiny, gguf, count = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
real_model = transformers.AutoModelForCausalLM.from_pretrained.__func__
real_tok = transformers.AutoTokenizer.from_pretrained.__func__

def model_from(cls, name, *args, **kwargs):
    if kwargs.pop("gguf_file", None):
        with open(count, "a") as f:
            f.write("converted\\n")
        time.sleep(2.0)                       # a real conversion takes about a minute
        return real_model(cls, tiny, *args, **kwargs)
    return real_model(cls, name, *args, **kwargs)

def tok_from(cls, name, *args, **kwargs):
    kwargs.pop("gguf_file", None)
    return real_tok(cls, tiny if name == str(gguf.parent) else name, *args, **kwargs)

transformers.AutoModelForCausalLM.from_pretrained = classmethod(model_from)
transformers.AutoTokenizer.from_pretrained = classmethod(tok_from)
loaded = loader.load_model(str(gguf), device="cpu", dtype="float32", progress=False)
print("loaded", loaded.directory)
"""


@pytest.mark.timeout(600)
def test_concurrent_conversions_share_one_result(tmp_path: Path) -> None:
    tiny = build_tiny_model(tmp_path / "tiny")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    count = tmp_path / "conversions"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p), "SOLDAEMON_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT, str(tiny), str(gguf), str(count)], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=500) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert out.startswith("loaded "), out
    assert count.read_text().count("converted") == 1
    assert len({out.split()[1] for out, _ in outs}) == 1
    models = tmp_path / "cache" / "models"
    assert not [p.name for p in models.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    """The lock is re-entrant per thread, not per process: a second thread's
    exclusive hold waits for the first's to end (each thread its own file)."""
    import threading
    import time

    from soldaemon.weights.cachelock import cache_lock

    cache = tmp_path / "model"
    order: list[str] = []
    first_in = threading.Event()

    def first() -> None:
        with cache_lock(cache, exclusive=True):
            with cache_lock(cache, exclusive=True):      # re-entrant in its own thread
                first_in.set()
                time.sleep(0.3)
                order.append("first done")

    def second() -> None:
        first_in.wait()
        with cache_lock(cache, exclusive=True):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["first done", "second in"]
