"""Graph decode steps against eager ones, in the precision the device uses.

The eager step (``LeanBackend.forward``) runs unmasked attention over exactly
the ``pos + 1`` cached keys; the graph step (:mod:`.cudagraph`) masked
attention over a padded window. In float32 they agree to rounding; in
bfloat16 on a GPU they are different kernels, so their agreement is
measured, not assumed:

- *teacher-forced*: at every step both paths compute the logits for the same
  token over the same (eager-written) cache; the largest absolute logit
  difference, and how often their argmax agrees;
- *free-running*: greedy generation through each path alone from the same
  prompt; whether the token sequences are identical and where they first part;
- optionally the eager steps against a *reference* (transformers' own
  forward over the same tokens, as ``generate()`` computes them): the lean
  runtime's math in the device's precision, judged by the same tolerance;
- optionally every path against a float32 *anchor* (transformers' forward
  of a float32 copy of the model). In half precision two correct paths
  differ by their rounding, which a deep model amplifies layer by layer
  (random weights of Qwen2.5-Coder-1.5B's shape on the H200 in bfloat16:
  graphs vs eager 0.90, eager vs transformers' own bfloat16 forward 0.84,
  both over the fixed tolerance; docs/gpu.md). A bug (a wrong position, a
  mask off by one, a stale cache) takes a path *away from the float32
  truth*; rounding does not take one path much further than the other.
  So where the fixed tolerance is exceeded in half precision, the pair
  still passes when the path judged is as close to the anchor as the path
  it is judged against (:data:`ANCHOR_RATIO` of its mean deviation, and
  its argmax agreement with the anchor on decisive steps within
  :data:`ANCHOR_AGREEMENT_SLACK`).

:func:`compare_graphs` measures; :class:`GraphAgreement.failures` judges
against a stated :class:`Tolerance` (``scripts/gpu_latency.py`` and
``scripts/gpu_check.sh`` exit non-zero on a failure).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from soldaemon.runtime.kv.session import KVSession


@dataclass(frozen=True)
class Tolerance:
    """What graph steps may differ from eager ones by (teacher-forced)."""

    logit_rtol: float          # max |graph − eager| ≤ logit_rtol × max |eager| + logit_atol, every step
    logit_atol: float
    min_agreement: float       # share of steps whose argmax agrees, at least
    free_must_match: bool = False   # free-running greedy tokens identical on every document


# float32: one kernel's rounding apart. Half precisions: attention outputs
# differ by about one bf16/fp16 step per layer and the difference grows
# through the layers; a near-tie between the top two logits may then flip.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(1e-4, 1e-4, 1.0, free_must_match=True),
    torch.bfloat16: Tolerance(0.05, 0.05, 0.95),
    torch.float16: Tolerance(0.02, 0.02, 0.97),
}


# half precision over its fixed tolerance still passes when the judged path is
# this close to the float32 anchor, relative to the path it is judged against
ANCHOR_RATIO = 1.25
ANCHOR_AGREEMENT_SLACK = 0.05


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The stated tolerance for a model dtype (float32's for others)."""
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


# the precision a kernel plan's product rounds to (int8 kernels: bfloat16 activations)
KERNEL_PRECISION = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                    "int8": torch.bfloat16, "int8-dynamic": torch.bfloat16}
_LOOSENESS = [torch.float32, torch.float16, torch.bfloat16]


def decode_precision(backend: Any) -> torch.dtype:
    """The coarser of the backend's compute dtype and its decode kernel's
    (``plan.short``) precision: what decode steps round to."""
    kernel = KERNEL_PRECISION.get(str(getattr(getattr(backend, "plan", None), "short", "")), backend.dtype)
    ranked = [d for d in (backend.dtype, kernel) if d in _LOOSENESS]
    return max(ranked, key=_LOOSENESS.index) if ranked else backend.dtype


@dataclass
class AnchorDeviation:
    """One path's teacher-forced logits against the float32 anchor's."""

    steps: int = 0
    err_sum: float = 0.0               # sum over steps of max |path − anchor|
    max_err: float = 0.0
    decisive_steps: int = 0            # steps whose anchor margin is over twice the noise
    decisive_agree: int = 0            # of which the path's argmax is the anchor's

    @property
    def mean_err(self) -> float:
        return self.err_sum / self.steps if self.steps else 0.0

    @property
    def decisive_agreement(self) -> float:
        return self.decisive_agree / self.decisive_steps if self.decisive_steps else 1.0


@dataclass
class GraphAgreement:
    """Measured agreement of graph and eager decode steps."""

    dtype: str
    tolerance: Tolerance
    documents: int = 0
    steps: int = 0                     # teacher-forced steps compared
    agree: int = 0                     # of which the argmax agreed
    max_abs_diff: float = 0.0          # over every logit of every step
    strain: float = 0.0                # max over steps of diff / (atol + rtol × max|eager|); ≤ 1 passes
    worst_step: dict[str, Any] = field(default_factory=dict)   # the step of that maximum
    free_equal: int = 0                # documents whose free-running greedy tokens were identical
    first_divergence: list[int | None] = field(default_factory=list)   # per document; None: identical
    replays: int = 0                   # graph replays during the comparison (0: graphs never ran)
    ref_steps: int = 0                 # eager steps compared with the reference (0: none given)
    ref_agree: int = 0                 # of which the argmax agreed
    ref_max_abs_diff: float = 0.0
    ref_strain: float = 0.0            # as ``strain``, eager against the reference
    # margin-aware agreement: only the steps whose top-1/top-2 logit margin
    # (of the eager step; of the reference) is over twice the tolerance's
    # logit noise, where rounding alone cannot flip the argmax
    decisive_steps: int = 0
    decisive_agree: int = 0
    ref_decisive_steps: int = 0
    ref_decisive_agree: int = 0
    # against the float32 anchor, per path: "graphs", "eager", "reference"
    anchor: dict[str, AnchorDeviation] = field(default_factory=dict)

    def as_close_to_anchor(self, path: str, than: str) -> bool:
        """In half precision: ``path`` is about as close to the float32
        anchor as ``than`` (see the module doc); False without an anchor
        or in float32 (judged by its tolerance alone)."""
        a, b = self.anchor.get(path), self.anchor.get(than)
        if self.tolerance.free_must_match or a is None or b is None or not a.steps or not b.steps:
            return False
        return (a.mean_err <= ANCHOR_RATIO * b.mean_err
                and a.decisive_agreement >= b.decisive_agreement - ANCHOR_AGREEMENT_SLACK)

    @property
    def decisive_agreement(self) -> float:
        """Argmax agreement over the decisive steps (1.0 when there are none)."""
        return self.decisive_agree / self.decisive_steps if self.decisive_steps else 1.0

    @property
    def agreement(self) -> float:
        return self.agree / self.steps if self.steps else 0.0

    def failures(self) -> list[str]:
        """Why this is outside the tolerance; [] when it passes."""
        tol = self.tolerance
        out = []
        if self.steps == 0 or self.replays == 0:
            out.append("no graph step ran")
        if self.strain > 1.0 and not self.as_close_to_anchor("graphs", "eager"):
            out.append(f"logits differ by up to {self.max_abs_diff:.4g} (worst step {self.worst_step}), "
                       f"over {tol.logit_rtol} x max|eager| + {tol.logit_atol}" + self._anchor_words("graphs", "eager"))
        # float32 must agree everywhere; half precisions where the margin is decisive
        if tol.free_must_match and self.agreement < tol.min_agreement:
            out.append(f"argmax agrees on {self.agree}/{self.steps} steps, under {tol.min_agreement:.0%}")
        if not tol.free_must_match and self.decisive_agreement < tol.min_agreement:
            out.append(f"argmax agrees on {self.decisive_agree}/{self.decisive_steps} steps whose margin is over "
                       f"the noise, under {tol.min_agreement:.0%}")
        ref_agree, ref_steps = ((self.ref_agree, self.ref_steps) if tol.free_must_match
                                else (self.ref_decisive_agree, self.ref_decisive_steps))
        if (self.ref_steps and (self.ref_strain > 1.0 or ref_agree < tol.min_agreement * ref_steps)
                and not self.as_close_to_anchor("eager", "reference")):
            out.append(f"eager steps vs the reference: logits differ by up to {self.ref_max_abs_diff:.4g} "
                       f"(strain {self.ref_strain:.2f}), argmax agrees on {self.ref_agree}/{self.ref_steps}"
                       + self._anchor_words("eager", "reference"))
        if tol.free_must_match and self.free_equal < self.documents:
            out.append(f"free-running greedy tokens differ on {self.documents - self.free_equal}/"
                       f"{self.documents} documents (first at {self.first_divergence})")
        return out

    def _anchor_words(self, path: str, than: str) -> str:
        a, b = self.anchor.get(path), self.anchor.get(than)
        if a is None or b is None:
            return ""
        return (f"; against the float32 anchor: {path} mean max|diff| {a.mean_err:.4g} vs {than} {b.mean_err:.4g} "
                f"(allowed {ANCHOR_RATIO}x), decisive argmax {a.decisive_agreement:.3f} vs {b.decisive_agreement:.3f}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name, dev in self.anchor.items():
            d["anchor"][name].update(mean_err=round(dev.mean_err, 5),
                                     decisive_agreement=round(dev.decisive_agreement, 4))
        d["agreement"] = round(self.agreement, 4)
        d["decisive_agreement"] = round(self.decisive_agreement, 4)
        d["failures"] = self.failures()
        return d


# (token ids, k) → logits [k, V] float32 after each of the last k tokens
Reference = Callable[[Sequence[int], int], torch.Tensor]


@torch.inference_mode()
def compare_graphs(backend: Any, graphs: Any, prompts: Sequence[Sequence[int]], steps: int,
                   tolerance: Tolerance | None = None, reference: Reference | None = None,
                   anchor: Reference | None = None) -> GraphAgreement:
    """Compare ``graphs`` (a :class:`~.cudagraph.GraphDecoder` over the lean
    ``backend``) with the eager forward on each prompt for ``steps`` decode
    steps, teacher-forced and free-running (see the module doc), against
    ``tolerance`` (default: that of :func:`decode_precision`); with
    ``reference``, the eager steps against it too (a quantized plan's
    steps differ from a dense reference by its rounding: pass the
    reference only for a dense plan); with ``anchor`` (a float32
    forward of the same model), every path against it. Uses the
    backend's current cache and leaves ``backend.graphs`` as it found it.
    Raises ValueError when a prompt plus ``steps`` does not fit the cache."""
    tol = tolerance or tolerance_for(decode_precision(backend))
    result = GraphAgreement(str(backend.dtype).removeprefix("torch."), tol)
    kept = backend.graphs
    replays0 = graphs.replays
    try:
        for ids in prompts:
            if len(ids) + steps + 1 >= backend.n_ctx:
                raise ValueError(f"prompt of {len(ids)} + {steps} steps does not fit n_ctx {backend.n_ctx}")
            backend.graphs = None
            session = KVSession(backend, cache=backend.cache)
            first = session.prefill(list(ids)).logits
            fed, eager_rows = _teacher_forced(backend, graphs, session, first, steps, result)
            ref_rows = None
            if reference is not None and eager_rows:
                ref_rows = reference(list(ids) + fed, len(fed))
                _against_reference(ref_rows, torch.stack(eager_rows), result)
            if anchor is not None and fed:
                # each path alone over its own cache: interleaved, a graph step
                # that writes a wrong slot would take the eager steps with it
                truth = anchor(list(ids) + fed, len(fed))
                paths = {"eager": _fed_run(session, ids, fed)}
                backend.graphs = graphs
                paths["graphs"] = _fed_run(session, ids, fed)
                backend.graphs = None
                session.truncate(0)
                first = session.prefill(list(ids)).logits     # the prompt's slots as prefill wrote them
                if ref_rows is not None:
                    paths["reference"] = ref_rows
                for name, rows in paths.items():
                    _against_anchor(truth, rows, result.anchor.setdefault(name, AnchorDeviation()),
                                    result.tolerance)
            eager = _free_run(session, len(ids), first, steps)
            backend.graphs = graphs
            graph = _free_run(session, len(ids), first, steps)
            result.documents += 1
            split = next((i for i, (a, b) in enumerate(zip(eager, graph)) if a != b), None)
            result.first_divergence.append(split)
            result.free_equal += split is None
    finally:
        backend.graphs = kept
    result.replays = graphs.replays - replays0
    return result


def _strain(diff: torch.Tensor, scale: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """How much of the tolerance a difference uses (≤ 1 passes)."""
    return diff / (tol.logit_atol + tol.logit_rtol * scale)


def _margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last dim."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def _noise(scale: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """The logit difference the tolerance allows at this logit scale."""
    return tol.logit_atol + tol.logit_rtol * scale


def _against_reference(ref: torch.Tensor, eager: torch.Tensor, result: GraphAgreement) -> None:
    """Eager step logits [k, V] against the reference's for the same tokens."""
    ref = ref.to(eager.device)
    diff = (eager - ref).abs().amax(-1)                  # [k]
    result.ref_steps += eager.shape[0]
    result.ref_agree += int((eager.argmax(-1) == ref.argmax(-1)).sum())
    result.ref_max_abs_diff = max(result.ref_max_abs_diff, float(diff.max()))
    decisive = _margin(ref) > 2 * _noise(ref.abs().amax(-1), result.tolerance)
    result.ref_decisive_steps += int(decisive.sum())
    result.ref_decisive_agree += int(((eager.argmax(-1) == ref.argmax(-1)) & decisive).sum())
    result.ref_strain = max(result.ref_strain, float(_strain(diff, ref.abs().amax(-1), result.tolerance).max()))


def _against_anchor(truth: torch.Tensor, rows: torch.Tensor, dev: AnchorDeviation, tol: Tolerance) -> None:
    """One path's logits [k, V] against the float32 anchor's for the same tokens."""
    truth = truth.to(rows.device).float()
    diff = (rows.float() - truth).abs().amax(-1)          # [k]
    dev.steps += int(diff.numel())
    dev.err_sum += float(diff.sum())
    dev.max_err = max(dev.max_err, float(diff.max()))
    decisive = _margin(truth) > 2 * _noise(truth.abs().amax(-1), tol)
    dev.decisive_steps += int(decisive.sum())
    dev.decisive_agree += int(((rows.argmax(-1) == truth.argmax(-1)) & decisive).sum())


def _teacher_forced(backend: Any, graphs: Any, session: KVSession, logits: torch.Tensor, steps: int,
                    result: GraphAgreement) -> tuple[list[int], list[torch.Tensor]]:
    """Both paths at each position for the eager path's greedy token; the
    graph step first, so the cache keeps what the eager step wrote. Returns
    the tokens fed and the eager logits after each."""
    tol = result.tolerance
    pos = len(session.tokens)
    token = int(logits.argmax())
    fed: list[int] = []
    rows: list[torch.Tensor] = []
    for _ in range(steps):
        g = graphs.step(token, pos, session.cache)
        if g is None:
            break                                       # graphs off (e.g. capture failed): reported as failure
        g = g.clone()
        e = backend.forward(torch.tensor([token], device=backend.device), pos, cache=session.cache)[0]
        fed.append(token)
        rows.append(e)
        diff_t, scale_t = (g - e).abs().max(), e.abs().max()
        diff, scale = float(diff_t), float(scale_t)
        strain = float(_strain(diff_t, scale_t, tol))
        if strain > result.strain or not result.worst_step:
            result.worst_step = {"pos": pos, "diff": float(f"{diff:.4g}"), "max_abs_eager": float(f"{scale:.4g}")}
            result.strain = strain
        result.max_abs_diff = max(result.max_abs_diff, diff)
        result.steps += 1
        token = int(e.argmax())
        result.agree += int(g.argmax()) == token
        if float(_margin(e)) > 2 * float(_noise(scale_t, tol)):
            result.decisive_steps += 1
            result.decisive_agree += int(g.argmax()) == token
        pos += 1
    return fed, rows


def _fed_run(session: KVSession, ids: Sequence[int], fed: Sequence[int]) -> torch.Tensor:
    """The logits [k, V] after each of the ``fed`` tokens from a fresh
    prefill of ``ids``, through whichever path the backend's ``graphs``
    selects alone (decode steps only: the prefill is eager)."""
    session.truncate(0)
    session.prefill(list(ids))
    return torch.stack([session.decode_step(token).clone() for token in fed])


def _free_run(session: KVSession, prompt_len: int, first: torch.Tensor, steps: int) -> list[int]:
    """Greedy tokens from the prompt (whichever path the backend's
    ``graphs`` selects)."""
    session.truncate(prompt_len, first)
    token = int(first.argmax())
    out = [token]
    for _ in range(steps - 1):
        token = int(session.decode_step(token).argmax())
        out.append(token)
    return out


def transformers_reference(model: Any) -> Reference:
    """transformers' own forward of ``model`` (no cache, the whole sequence
    at once) as the reference for the eager steps (or, of a float32 copy,
    as the anchor: :func:`float32_anchor`)."""
    def run(ids: Sequence[int], k: int) -> torch.Tensor:
        x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
        with torch.inference_mode():
            return model(input_ids=x, use_cache=False, logits_to_keep=k).logits[0].float()
    return run


def float32_anchor(model: Any) -> Reference:
    """The float32 anchor: transformers' forward of a float32 copy of
    ``model`` (a half-precision module), on its device; the TF32 matrix
    mode off while it runs, so the anchor is float32 products."""
    import copy

    exact = copy.deepcopy(model).float().eval()
    forward = transformers_reference(exact)

    def run(ids: Sequence[int], k: int) -> torch.Tensor:
        kept = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return forward(ids, k)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = kept
    return run
