"""The KV cache: per-document sessions reused across keystrokes
(:mod:`.session`) and folding of parked ones (:mod:`.fold`)."""
