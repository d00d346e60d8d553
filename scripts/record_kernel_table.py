"""Record the kernel timing table of this machine for a model's shapes, as
the daemon measures it at first start (soldaemon.runtime.forward.kernels), into a
JSON file: the recorded tables the plan chooser is tested over
(tests/data/kernel_tables/). The file says its ``format`` (kernels.PLAN_FORMAT)
and ``table.products``: the products of one layer that ``blocks`` timed (the
forward's packed four since format 5; the tables recorded before name the
seven apart).

    python scripts/record_kernel_table.py --model-config DIR_OR_SHAPES --out FILE [--note TEXT]

``--embedded NAME`` uses an embedded model's shapes (``qwen2.5-coder-0.5b``,
``qwen2.5-coder-1.5b``) without loading any weights; ``--qwen05b`` is the 0.5B's.
To record what an AVX2-only machine does on a newer CPU, cap the libraries'
instruction sets in the environment (oneDNN, MKL, ATen) and say so:

    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \\
        python scripts/record_kernel_table.py --qwen05b --isa-cap AVX2 --out avx2_only.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from soldaemon.policy.kernel_plan import PLAN_NOTE, choose_plan  # noqa: E402
from soldaemon.runtime.forward.kernels import PLAN_FORMAT, measure_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen05b", action="store_true", help="Qwen2.5-Coder-0.5B's shapes")
    ap.add_argument("--embedded", help="an embedded model's shapes, by name (soldaemon.weights.embedded)")
    ap.add_argument("--model-config", help="a Hugging Face model directory (its config.json)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa-cap", help="the instruction set the libraries were capped at, if any (recorded)")
    ap.add_argument("--note", default="", help="free text recorded beside the table")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from transformers import AutoConfig, Qwen2Config

    cfg: object

    if args.embedded:
        from soldaemon.weights.embedded import resolve_model_name

        shapes = resolve_model_name(args.embedded).shapes
        assert shapes is not None
        cfg = shapes.config()
    elif args.qwen05b:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2)
    elif args.model_config:
        cfg = AutoConfig.from_pretrained(args.model_config)
    else:
        ap.error("give --embedded, --qwen05b or --model-config")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    table = measure_table(cfg, torch.device("cpu"), torch.float32, repeats=args.repeats,
                          say=lambda m: print(m, file=sys.stderr))
    if args.isa_cap:
        table.machine["isa_cap"] = args.isa_cap
    if args.note:
        table.machine["note"] = args.note
    plan = choose_plan(table)
    args.out.write_text(json.dumps({"format": PLAN_FORMAT, "table": table.to_dict(),
                                    "chosen": plan.to_dict(), "about": PLAN_NOTE}, indent=1))
    print(f"{time.perf_counter() - t0:.0f} s; plan: {plan.describe()}\n{plan.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
