"""The test suite keeps out of the user's soldaemon folders (tests/conftest.py):
the tiny model's kernel plans land in the run's private cache, while the
converted weights are the user's, shared."""

from __future__ import annotations

import os
from pathlib import Path

from soldaemon import paths


def test_a_tiny_models_plan_lands_in_the_private_cache_not_the_users() -> None:
    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    user = Path(os.environ["SOL_TESTS_USER_CACHE"])
    assert paths.cache_dir() != user and paths.state_dir() != Path(os.environ["SOL_TESTS_USER_CACHE"])
    assert (paths.cache_dir() / "models").resolve() == (user / "models").resolve()   # weights shared
    # a shape nobody else times, so that its file names this run's plan
    cfg = Qwen2Config(vocab_size=509, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    key = kernels.plan_key(cfg, torch.device("cpu"), torch.float32)
    kernels.plan_for(cfg, torch.device("cpu"), torch.float32, load=lambda: (0.0, 2))
    assert (paths.cache_dir() / "kernel-plans" / f"{key}.json").is_file()
    assert not (paths.cache_dir() / "kernel-plans").is_symlink()
    assert not (user / "kernel-plans" / f"{key}.json").exists()


def test_the_suites_private_folders_reach_the_processes_it_starts() -> None:
    import subprocess
    import sys

    code = "from soldaemon import paths; print(paths.cache_dir()); print(paths.state_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == [str(paths.cache_dir()), str(paths.state_dir())]
