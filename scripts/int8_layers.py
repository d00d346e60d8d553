"""Where the int8 plan's error lives, layer by layer (docs/kernels.md,
"Design decisions", rotated activations): the int8 plan with one decoder layer's products in
float32 (its rotated weights, the same model in exact arithmetic), and the
mean KL(float32 || that) over real code, teacher forced in one forward per
file. A layer whose float32 copy removes much of the plan's KL would be
worth keeping wide; an error spread evenly over the layers is not.

    python scripts/int8_layers.py [--model qwen2.5-coder-0.5b] [--top 4]
"""

from __future__ import annotations

import argparse
import pathlib
import sysconfig

import torch

from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.kernels import KERNEL_FNS
from soldaemon.weights.loader import load_model

FILES = ("tokenize.py", "heapq.py", "shlex.py", "queue.py", "difflib.py", "argparse.py")
START, TOKENS = 500, 896
INT8 = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic")


class Widened(LeanBackend):
    """The int8 plan, with the layers in ``wide`` run in float32 over float
    copies of their (rotated) weights."""

    def __init__(self, hf_model, n_ctx: int) -> None:
        super().__init__(hf_model, n_ctx, plan=INT8)
        int8 = self.plan
        self.plan = KernelPlan("float32", "float32", "float32", int8.head_storage, int8.head)
        self.float_layers = [self._layer_weights(layer) for layer in hf_model.model.layers]
        self.plan = int8
        self.wide: set[int] = set()

    def _block(self, x, w, i, pos, end, cos, sin, mask, attention, lin, kind=""):
        if i in self.wide:
            w, lin = self.float_layers[i], KERNEL_FNS["float32"]
        return super()._block(x, w, i, pos, end, cos, sin, mask, attention, lin, kind)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--top", type=int, default=4, help="then the best 1 … TOP layers together")
    args = ap.parse_args()
    loaded = load_model(None, name=args.model, device="cpu", dtype="stored", progress=False)
    tok, hf = loaded.tokenizer, loaded.model
    lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = [torch.tensor(tok.encode((lib / f).read_text())[START:START + TOKENS]) for f in FILES]

    def run(be: LeanBackend) -> torch.Tensor:
        return torch.cat([be.forward(t, 0, last_only=False).float() for t in texts]).log_softmax(-1)

    ref = run(LeanBackend(hf, 2048, plan=KernelPlan.uniform("float32")))
    be = Widened(hf, 2048)

    def score(label: str) -> float:
        got = run(be)
        differ = int((got.argmax(-1) != ref.argmax(-1)).sum())
        kl = float((ref.exp() * (ref - got)).sum(-1).mean())
        print(f"{label:28s} top token differs at {differ} of {len(ref)}; KL mean {kl:.5f}", flush=True)
        return kl

    base = score("int8 plan")
    per_layer = {}
    for i in range(len(be.layers)):
        be.wide = {i}
        per_layer[i] = score(f"layer {i} in float32")
    order = sorted(per_layer, key=per_layer.get)
    print(f"share of the plan's KL that one layer in float32 removes: "
          f"{(base - per_layer[order[0]]) / base:.0%} at best (layer {order[0]}), "
          f"{(base - per_layer[order[-1]]) / base:.0%} at worst (layer {order[-1]})")
    for k in range(2, args.top + 1):
        be.wide = set(order[:k])
        score(f"layers {sorted(be.wide)} in float32")


if __name__ == "__main__":
    main()
