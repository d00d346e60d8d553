"""What never leaves the machine: :mod:`.rules` (which files are never read
into a prompt) and :mod:`.scan` (secrets in the text that is sent, redacted).
Shared by the daemon and sol-lsp, so light: no torch, no server.
"""
