"""Where the weights live: the weight store and layer offload
(:mod:`.weightstore`), prefetch of offloaded layers (:mod:`.prefetch`) and
the memory scheduler (:mod:`.scheduler`), and the C heap handed back when
idle (:mod:`.heap`)."""
