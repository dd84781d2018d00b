"""Processes that join simulated calls over the sideband: ``ours`` (the
voiceactors runtime, joined by ``Connect`` messages) and ``served`` (a whole
``voiceactors serve``, joined by ``POST /api/voice/connect``).

They share one command line (``args.peer_parser``) and one stdin/stdout protocol
with the driver: print ``STARTED`` when ready to connect, read one line
(``GO``), join every call id, print ``JOINED``, and exit when every call has
ended, stdin closes, or ``--max-seconds`` passes.

``nothing`` is not one of them: it is the do-nothing *server* the burst,
the tool round and the one-call benchmarks measure ours against, joined by
``POST /api/voice/connect`` like ours (its own docstring has its protocol).
"""
