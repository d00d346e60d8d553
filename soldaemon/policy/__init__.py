"""Sol's decisions (residency, memory, drafts, KV folding, kernels, job
priority, the model choice) as plain Python over numbers: no torch, tested
with torch blocked. The runtime reads them through small dataclasses and
plain values; nothing here reaches back into it.
"""
