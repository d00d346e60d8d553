"""``soldaemon doctor``: is this machine ready to serve, and why not.

:mod:`.checks` runs every check and prints the report; :mod:`.daemon` asks the
running daemon; :mod:`.plan` reads the kernel plan and model choice the
daemon cached. No torch.
"""
