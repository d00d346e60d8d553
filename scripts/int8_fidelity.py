"""How far each kernel plan's next-token distribution is from float32's on
real code (docs/kernels.md, "Design decisions", rotated activations): teacher forced over four
standard-library files (a 384-token prompt, then 8-token verifies up to 512
more tokens each), the same runtime in float32 as the reference. Prints, per
plan, the positions whose top token differs and the mean KL(float32 || plan).

    python scripts/int8_fidelity.py [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import pathlib
import sysconfig

import torch

from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.kv.session import KVSession
from soldaemon.weights.loader import load_model

FILES = ("tokenize.py", "heapq.py", "shlex.py", "queue.py")
PROMPT, SPAN, ROWS = 384, 512, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    loaded = load_model(None, name=args.model, device="cpu", dtype="stored", progress=False)
    tok, hf = loaded.tokenizer, loaded.model
    lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = [tok.encode((lib / f).read_text())[:PROMPT + SPAN] for f in FILES]

    def run(be: LeanBackend) -> torch.Tensor:
        out = []
        for ids in texts:
            session = KVSession(be, cache=be.new_cache())
            session.prefill(ids[:PROMPT])
            for i in range(PROMPT, len(ids) - 1, ROWS):
                out.append(session.verify(ids[i:i + ROWS]).float())
        return torch.cat(out)

    ref = run(LeanBackend(hf, 2048, plan=KernelPlan.uniform("float32"))).log_softmax(-1)
    int8 = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic")
    plans = (("bfloat16", KernelPlan.uniform("bfloat16"), False),
             ("int8 weight-only", KernelPlan("int8", "int8", "int8", "int8", "int8"), False),
             ("int8-dynamic", int8, False),
             ("int8-dynamic, rotated", int8, True))
    for label, plan, rotate in plans:
        got = run(LeanBackend(hf, 2048, plan=plan, rotate=rotate)).log_softmax(-1)
        differ = int((got.argmax(-1) != ref.argmax(-1)).sum())
        kl = float((ref.exp() * (ref - got)).sum(-1).mean())
        print(f"{label:24s} top token differs at {differ} of {len(ref)} positions; KL mean {kl:.5f}", flush=True)


if __name__ == "__main__":
    main()
