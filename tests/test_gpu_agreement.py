"""Issue 27.8: in half precision the graph-vs-eager argmax agreement is
judged only where the top-1/top-2 margin is over the dtype's noise: a
near-tie flipped by rounding is not a failure, a decisive flip is."""

from __future__ import annotations

import torch

from soldaemon_bench.graphcheck import GraphAgreement, _margin, _noise, tolerance_for


def _judge(flips_near_ties: int, flips_decisive: int, steps: int = 40) -> list[str]:
    tol = tolerance_for(torch.bfloat16)
    r = GraphAgreement("bfloat16", tol, documents=1, steps=steps, replays=steps)
    r.agree = steps - flips_near_ties - flips_decisive
    r.decisive_steps = steps - 10                 # 10 steps were near-ties
    r.decisive_agree = r.decisive_steps - flips_decisive
    return r.failures()


def test_near_tie_flips_pass_and_decisive_flips_fail() -> None:
    assert _judge(flips_near_ties=5, flips_decisive=0) == []          # raw agreement 35/40 = 87.5 % < 95 %
    failures = _judge(flips_near_ties=0, flips_decisive=3)
    assert len(failures) == 1 and "margin is over the noise" in failures[0]


def test_the_margin_and_the_noise() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.5], [0.0, -1.0, 4.0]])
    assert torch.allclose(_margin(logits), torch.tensor([0.5, 4.0]))
    tol = tolerance_for(torch.bfloat16)
    assert float(_noise(torch.tensor(4.0), tol)) == tol.logit_atol + 4.0 * tol.logit_rtol
