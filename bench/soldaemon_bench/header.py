"""What a bench's first line says about the engine it measured."""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from soldaemon.config import Config


def arithmetic(info: Mapping[str, Any]) -> str:
    """How ``info``'s engine (``Engine.info()``) computes: the compute dtype
    (residual stream, attention, KV) and, under a kernel plan, the weights'
    format and the kernels that read them -- a plan's model computes its
    products in int8 while its ``dtype`` still says float32."""
    precision = info.get("precision") or {}
    plan = precision.get("plan")
    if not plan:
        return str(info["dtype"])
    kernels = "/".join(dict.fromkeys((plan["prefill"], plan["short"], plan["head"])))
    return (f"{info['dtype']} activations, {plan['storage']} weights, {kernels} kernels"
            + (", rotated" if precision.get("rotated") else ""))


def engine_label(info: Mapping[str, Any]) -> str:
    """``<model> (<arithmetic>, <backend>) on <device>`` for a bench's header."""
    return f"{info['model']} ({arithmetic(info)}, {info['backend']}) on {info['device']}"


def with_windows(config: Config, args: argparse.Namespace) -> Config:
    """``config`` with the prompt windows that ``--max-prefix-tokens`` /
    ``--max-suffix-tokens`` name; a flag not given leaves the key as
    configured (by default ``auto``: the served model's windows, what the
    daemon gives an editor)."""
    overrides = {f"model.max_{side}_tokens": value
                 for side, value in (("prefix", getattr(args, "max_prefix_tokens", None)),
                                     ("suffix", getattr(args, "max_suffix_tokens", None))) if value is not None}
    return config.with_overrides(overrides, source="bench") if overrides else config
