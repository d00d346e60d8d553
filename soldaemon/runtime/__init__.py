"""The local engine's mechanism (torch), carrying out what :mod:`soldaemon.policy` decides:
:mod:`.forward` (decoder layer, kernels, CUDA graphs), :mod:`.kv` (sessions, folding),
:mod:`.decode` (generation, drafts, sampling, healing, detokenizing), :mod:`.memory` (weights
under a budget), :mod:`.engine` (:class:`~soldaemon.runtime.engine.local.LocalEngine`)."""
