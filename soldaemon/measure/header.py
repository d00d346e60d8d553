"""What a bench's first line says about the engine it measured."""

from __future__ import annotations

from typing import Any, Mapping


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
