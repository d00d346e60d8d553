"""The daemon's own command-line clients: ``soldaemon status``, ``stop`` and
the daemon half of ``complete`` (:mod:`.commands`). A websocket client and
nothing more: no server, no torch. The daemon is found through its record
(:mod:`soldaemon.discovery`), as sol-lsp finds it."""
