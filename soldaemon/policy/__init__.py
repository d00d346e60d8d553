"""Sol's decisions, apart from the torch runtime that carries them out.

Every module here is plain Python and imports no torch, so the policy is
tested on any machine (tests/test_policy.py runs it with torch blocked):

- :mod:`.residency` — which weight units stay on the device; the heatmap;
- :mod:`.memory` — when memory is short, when idle weights are released;
- :mod:`.draft` — prompt-lookup drafts and how many to verify;
- :mod:`.fold` — which parked KV blocks are stored folded;
- :mod:`.kernel_plan` — which linear kernel serves each phase;
- :mod:`.priority` — the order the worker takes jobs in;
- :mod:`.model_choice` — which embedded model ``model.name: auto`` serves.

The mechanism (soldaemon/runtime/) reads these decisions through small
dataclasses and plain values; nothing here reaches back into it.
"""
