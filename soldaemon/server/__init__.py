"""``soldaemon serve`` and ``soldaemon status``: the websocket server over
one inference worker, and its client. One module per concern:

- :mod:`.worker` -- :class:`Job` and the one inference thread (it never
  touches a socket); :mod:`.fairqueue` its queue (strict priority classes,
  round-robin between owners) and :mod:`.fairness` the sharing rules;
  :mod:`.ahead` the slot for the engine's lowest-priority work (speculative
  FIM), run only when the queue is empty;
- :mod:`.connection` -- one websocket (decode, rate limit, supersede, cancel,
  ordered writes); :mod:`.gate` counts handshakes in progress;
- :mod:`.daemon` -- what connections share: the job registry, the HTTP hook
  (``/healthz``, ``/metrics`` from :mod:`.metrics`), state and drain;
- :mod:`.auth` -- the token (created here, read by :mod:`soldaemon.discovery`),
  the Origin and Host checks; :mod:`.handshake` -- header hygiene around them;
- :mod:`.statefiles` -- the state directory and writing the daemon record
  (reading it is :mod:`soldaemon.discovery`, shared with sol-lsp);
- :mod:`.engine_loader` -- which engine ``serve`` loads;
- :mod:`.command` -- start-up and shutdown; :mod:`.arguments` -- the options
  of ``serve`` and ``status``; :mod:`.settings` -- :class:`ServerSettings`;
- :mod:`.status` -- the ``soldaemon status`` client.

Threads: the engine runs on the worker thread only; everything else runs on
the event loop thread.
"""
