"""The forward pass: the lean decoder (:mod:`.backend`, :mod:`.layer`), the
linear kernels and their plan (:mod:`.kernels`, :mod:`.precision`), CUDA
graphs for the decode step (:mod:`.cudagraph`) and device clocks
(:mod:`.timing`)."""
