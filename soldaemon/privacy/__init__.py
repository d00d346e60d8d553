"""What never leaves the machine: :mod:`.rules` (files never read into a prompt) and :mod:`.scan`
(secrets in sent text, redacted). Shared by the daemon and sol-lsp, so light: no torch, no server.
"""
