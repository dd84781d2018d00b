"""Processes that join simulated calls over the sideband: ``ours`` (the
voiceactors runtime), ``baseline_asyncio`` (a naive asyncio loop over the
openai SDK) and ``agents_sdk`` (the OpenAI Agents SDK realtime session).

They share one command line (``args.peer_parser``) and one stdin/stdout protocol
with the driver: print ``STARTED`` when ready to connect, read one line
(``GO``), join every call id, print ``JOINED``, and exit when every call has
ended, stdin closes, or ``--max-seconds`` passes.

``floor`` is the harness's floor for those drivers (a raw websocket client).
``nothing`` is not one of them: it is a do-nothing *server* for
``benchmarks.burst``, joined by ``POST /api/voice/connect`` like ours (its
own docstring has its protocol).
"""
