"""Issue 27.9: sampling at temperature > 0 where the logits are (the CUDA
path, TopP._on_device), without copying or sorting the vocabulary on the
host. Run here on CPU tensors: the same code, the same answers."""

from __future__ import annotations

import torch

from soldaemon.runtime.decode.sampling import TopP


def test_device_nucleus_keeps_only_the_nucleus() -> None:
    logits = torch.full((151936,), -20.0)
    logits[[7, 11, 13]] = torch.tensor([5.0, 4.0, 1.0])         # p ≈ 0.71, 0.26, 0.013
    sampler = TopP(1.0, top_p=0.9, seed=0)
    seen = {sampler._on_device(logits) for _ in range(200)}
    assert seen == {7, 11}                                       # 13 is outside the 0.9 nucleus


def test_device_nucleus_beyond_the_top_k_falls_back_to_the_full_sort() -> None:
    logits = torch.zeros(4000)                                   # flat: the top 256 hold 6.4 % of the mass
    sampler = TopP(1.0, top_p=0.5, seed=1)
    picks = [sampler._on_device(logits) for _ in range(400)]
    assert len(set(picks)) > 150 and max(picks) >= 1000          # drawn from ~2000 tokens, not 256


def test_device_sampling_is_seeded() -> None:
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(3))
    a = [TopP(0.8, top_p=0.95, seed=42)._on_device(logits) for _ in range(1)]
    s1, s2 = TopP(0.8, top_p=0.95, seed=42), TopP(0.8, top_p=0.95, seed=42)
    assert [s1._on_device(logits) for _ in range(20)] == [s2._on_device(logits) for _ in range(20)]
    assert a[0] == TopP(0.8, top_p=0.95, seed=42)._on_device(logits)
