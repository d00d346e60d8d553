"""``soldaemon bench --quality``: how often the completion is right, measured
on holes cut from real code, for this daemon and for the model alone.

Holes come from :func:`soldaemon_bench.holes.cut_holes` (one-line holes at a random
column inside function bodies and blocks of 2-6 whole lines; never inside a
docstring), seeded. Every hole goes, in the same run, to these columns:

- ``sol``: the daemon's full pipeline, ``LocalEngine.complete`` -- windows,
  context, FIM template, stop rules, post-processing -- exactly what an
  editor gets (one column per ``--fim-orders`` entry when given);
- ``raw`` (with ``--baselines`` naming ``raw`` or ``generate``, as by
  default): the same model and runtime on a *plain* FIM prompt (the last
  ``max_prefix_tokens`` tokens of the prefix, the first ``max_suffix_tokens``
  of the suffix, no line alignment, no file path, no context), greedy,
  stopped only by a stop token (EOS, FIM tokens) or ``max_tokens``: what the
  model alone gives;
- ``raw+pp``: the ``raw`` text through the daemon's post-processing
  (no model run of its own, so no latency): what post-processing alone adds;
- ``sol +outline`` / ``sol -outline`` (``--ablate outline``): the daemon
  with the outline of what the prefix window left out
  (:func:`soldaemon.fim.scope_outline`) toggled from the served model's ``model.max_outline_tokens``
  (by default off for the 0.5B, so its column is ``+outline``; 128 for the 1.5B: ``-outline``);
- ``sol -healing`` (``--ablate healing``): the daemon without token
  healing (``completion.token_healing: false``);
- ``sol -anchor`` (``--ablate anchor``): the daemon with the middle
  starting at the cursor (``model.fim_anchor: cursor``) instead of at the
  cursor line's start;
- ``sol -candidates`` / ``sol +candidates`` (``--ablate candidates``):
  block candidates (:mod:`soldaemon.pipeline.candidates`) toggled from the
  served model's ``completion.candidates``: the greedy answer alone where it
  ranks several (the 1.5B: ``-candidates``), 4 where it does not (the 0.5B:
  ``+candidates``);
- ``sol+ctx`` / ``sol+ctx[order]`` (``--context siblings``): the daemon
  with the other source files of the hole's directory as context chunks
  (:func:`sibling_context`), chosen by relevance to the cursor
  (:mod:`soldaemon.pipeline.relevance`) and, as the ablation, as sent (no
  selector: by file name, each from its start, until the budget is spent);
- ``model alone (llama-cpp-python)`` (``--baselines`` naming ``llama.cpp``
  or ``model-alone``, as by default): llama.cpp's raw output through
  ``llama-cpp-python`` on the model's GGUF with the same plain prompt ids,
  to its end token or ``max_tokens`` (when installed and the model has a
  GGUF) -- the model alone, no editor's stop rule;
- ``llama.vscode`` (``--baselines`` naming it, as by default): llama.cpp's
  own ``llama-server``, built for this CPU (:mod:`.llama_server_build`),
  started with llama.vscode's documented flags on the model's GGUF, sent
  llama.vscode's ``/infill`` request and post-processed as its client does
  (:mod:`.llama_vscode`, :class:`LlamaVscode`): the peer as its users run it.
  Its same-run ratios are printed under the table.

Scores (see :func:`score`): exact match, first-line exact match, edit
similarity, and whether the file with the completion inserted still parses
(Python). Latency: end to end per hole, from the request to the final text,
on a cold KV cache (no reuse from the previous hole), p50 per column."""

from __future__ import annotations

from soldaemon_bench.quality.columns import (ABLATIONS, CONFIG_ABLATIONS, LLAMA_VSCODE, MODEL_ALONE, OUTLINE_TOKENS, LlamaCpp, LlamaVscode,
                      llama_cpp_column, llama_vscode_column, plain_prompt, postprocessed, run_raw, run_sol,
                      sibling_context, toggled_outline)
from soldaemon_bench.quality.command import DEFAULT_HOLES, DEFAULT_TOKENS, run
from soldaemon_bench.quality.report import agreement, plot, ratios, table
from soldaemon_bench.quality.scores import Column, Score, edit_similarity, exact_match, first_line_match, levenshtein, normalize, parses, score

__all__ = ["ABLATIONS", "CONFIG_ABLATIONS", "DEFAULT_HOLES", "DEFAULT_TOKENS", "LLAMA_VSCODE", "MODEL_ALONE",
           "OUTLINE_TOKENS", "Column", "LlamaCpp", "LlamaVscode", "llama_vscode_column", "ratios",
           "Score", "agreement", "edit_similarity", "exact_match", "first_line_match", "levenshtein", "llama_cpp_column",
           "normalize", "parses", "plain_prompt", "plot", "postprocessed", "run", "run_raw", "run_sol", "score",
           "sibling_context", "table", "toggled_outline"]
