"""Every measurement of the daemon, in one place and off the product's import
path (only ``soldaemon bench`` imports it, when parsed): :mod:`.bench` (this
runtime against ``generate()``), :mod:`.trace` (keystroke replay) with
:mod:`.jumps`, :mod:`.quality` (completion quality against the model alone
and llama.vscode), :mod:`.holes` and :mod:`.functional` (holes cut from real
code, scored by exact match and by tests), :mod:`.baselines`,
:mod:`.graphcheck` (CUDA graphs against eager), :mod:`.kvfold`, :mod:`.header`
(a bench's first line)."""
