"""The local engine's mechanism (torch), by role: :mod:`.forward` (the
decoder layer, kernels, CUDA graphs), :mod:`.kv` (sessions reused across
keystrokes, folding), :mod:`.decode` (generation, drafts, sampling, healing,
detokenizing), :mod:`.memory` (weights under a budget), :mod:`.engine`
(:class:`~soldaemon.runtime.engine.local.LocalEngine` and its model part).
It carries out what :mod:`soldaemon.policy` decides."""
