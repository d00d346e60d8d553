"""The remote backend: completions from an OpenAI-compatible engine elsewhere. :mod:`.engine` is
the Engine (with its local fallback); :mod:`.stream` one streamed request and its SSE parsing;
:mod:`.endpoint` the URL, API key and back-off; :mod:`.probe` the reachability probe."""
