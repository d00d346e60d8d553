"""The daemon's own command-line clients (:mod:`.commands`): a websocket client and nothing more
(no server, no torch), finding the daemon through its record as sol-lsp does."""
