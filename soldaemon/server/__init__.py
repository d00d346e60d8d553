"""``soldaemon serve``: the websocket server over one inference worker.

:mod:`.worker` owns the inference thread (the engine runs there only; everything else runs on
the event loop), :mod:`.connection` one websocket, :mod:`.daemon` what connections share,
:mod:`.auth` the token and Origin/Host checks, :mod:`.command` start-up and shutdown.
"""
