"""Would FBGEMM's packed int8 product serve the decoder layers better than
``torch._int_mm``? (docs/kernels.md, "Tried and not
kept".)

The plan's ``int8-dynamic`` kernel multiplies per-row-quantized activations
by a plain int8 weight with ``torch._int_mm``. FBGEMM (``quantized::
linear_dynamic`` on a ``linear_prepack``-ed weight) lays the weight out once,
but quantizes its input with one scale for all rows. This probe, on random
weights of the 0.5B's shapes (24 layers' seven products, more bytes than the
caches hold, as in a real forward), measures:

- accuracy of one 4,864 x 896 product on 5 rows, one of them 30x larger:
  ``int8-dynamic`` and FBGEMM, plain and with each row scaled to |x|max = 1
  behind an edge row (+1, -1, 0, ...) so that the quantization range is
  [-1, 1] whatever the other rows hold; and whether a row's result is the
  same computed alone or beside others;
- the time of all 168 products at 1 to 512 rows, the three kernels in turn,
  the fastest of 5 rounds (3 above 100 rows), as the forward groups them
  (q, k, v share one prepared input, gate and up another); then the output
  layer (151,936 x 896) alone at 1 and 9 rows.

    PYTHONPATH=. python scripts/packed_int8.py

Needs an x86 torch build (FBGEMM). Timings depend on the machine's load: run
it on a quiet machine.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from soldaemon.runtime.forward.kernels import Int8Dynamic, cpu_flags

D, F, LAYERS, VOCAB = 896, 4864, 24, 151936
SHAPES = [(D, D), (128, D), (128, D), (D, D), (F, D), (F, D), (D, F)]
GROUPS = ((0, 1, 2), (3,), (4, 5), (6,))


def prepack(q: torch.Tensor, s: torch.Tensor) -> Any:
    qt = torch._make_per_channel_quantized_tensor(q, s.double(), torch.zeros(q.shape[0], dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(qt, None)


def edge_prepare(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.abs().amax(1, keepdim=True).clamp_(min=1e-12)
    xn = x.new_zeros(x.shape[0] + 1, x.shape[1])
    xn[0, 0], xn[0, 1] = 1.0, -1.0
    torch.div(x, a, out=xn[1:])
    return xn, a


def edge_multiply(p: tuple[torch.Tensor, torch.Tensor], packed: Any) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(p[0], packed, False)[1:].mul_(p[1])


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = w.abs().amax(1) / 127
    return (w / s[:, None]).round().clamp(-127, 127).to(torch.int8), s


def accuracy() -> None:
    gen = torch.Generator().manual_seed(0)
    q, s = quantize(torch.randn(F, D, generator=gen) * 0.02)
    x = torch.randn(5, D, generator=gen)
    x[0] *= 30
    exact = x @ (q.float() * s[:, None]).t()
    packed = prepack(q, s)
    rows: dict[str, torch.Tensor] = {
        "int8-dynamic": Int8Dynamic()(x, q, None, s),
        "fbgemm, per-tensor": torch.ops.quantized.linear_dynamic(x, packed, False),
        "fbgemm, rows scaled + edge row": edge_multiply(edge_prepare(x), packed),
    }
    for name, y in rows.items():
        err = ((y - exact).abs().amax(1) / exact.abs().amax(1)).tolist()
        print(f"{name:32s} error per row (of |y|max): " + " ".join(f"{e:.4f}" for e in err))
    alone = torch.cat([edge_multiply(edge_prepare(x[i:i + 1]), packed) for i in range(5)])
    print("rows scaled + edge row, alone vs together: max difference",
          (alone - rows["fbgemm, rows scaled + edge row"]).abs().max().item())


def timing() -> None:
    weights = [[quantize(torch.randn(n, k) * 0.02) for n, k in SHAPES] for _ in range(LAYERS)]
    packs = [[prepack(q, s) for q, s in layer] for layer in weights]
    dyn = Int8Dynamic()

    def run_dynamic(xs: dict[int, torch.Tensor]) -> None:
        for layer in weights:
            for g in GROUPS:
                p = dyn.prepare(xs[SHAPES[g[0]][1]])
                for j in g:
                    dyn.multiply(p, layer[j][0], None, layer[j][1], torch.float32)

    def run_plain(xs: dict[int, torch.Tensor]) -> None:
        for layer in packs:
            for j, (_, k) in enumerate(SHAPES):
                torch.ops.quantized.linear_dynamic(xs[k], layer[j], False)

    def run_edge(xs: dict[int, torch.Tensor]) -> None:
        for layer in packs:
            for g in GROUPS:
                p = edge_prepare(xs[SHAPES[g[0]][1]])
                for j in g:
                    edge_multiply(p, layer[j])

    kernels: dict[str, Callable[[dict[int, torch.Tensor]], None]] = {
        "int8-dynamic (_int_mm)": run_dynamic, "fbgemm per-tensor": run_plain, "fbgemm rows+edge": run_edge}
    print("ms for all 168 products (24 layers), fastest of the rounds:")
    print("rows " + "".join(f"{name:>26s}" for name in kernels))
    for rows in (1, 2, 5, 9, 17, 64, 512):
        xs = {k: torch.randn(rows, k) for k in (D, F)}
        best = {name: float("inf") for name in kernels}
        for _ in range(5 if rows < 100 else 3):
            for name, fn in kernels.items():
                t0 = time.perf_counter()
                fn(xs)
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
        print(f"{rows:4d} " + "".join(f"{best[name]:26.1f}" for name in kernels), flush=True)
    del weights, packs
    head_q, head_s = quantize(torch.randn(VOCAB, D) * 0.02)     # the output layer alone
    head_packed = prepack(head_q, head_s)
    print(f"output layer ({VOCAB} x {D}), ms:")
    for rows in (1, 9):
        x = torch.randn(rows, D)
        best_dyn = best_edge = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            dyn(x, head_q, None, head_s)
            t1 = time.perf_counter()
            edge_multiply(edge_prepare(x), head_packed)
            t2 = time.perf_counter()
            best_dyn, best_edge = min(best_dyn, (t1 - t0) * 1e3), min(best_edge, (t2 - t1) * 1e3)
        print(f"{rows:4d} rows: int8-dynamic {best_dyn:.1f}, fbgemm rows+edge {best_edge:.1f}")


def main() -> int:
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        print("this torch build has no FBGEMM")
        return 1
    torch.backends.quantized.engine = "fbgemm"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU flags: {' '.join(cpu_flags())}")
    accuracy()
    timing()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
