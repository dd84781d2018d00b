"""Processes that join simulated calls over the sideband: ``ours`` (the
voiceactors runtime), ``baseline_asyncio`` (a naive asyncio loop over the
openai SDK) and ``agents_sdk`` (the OpenAI Agents SDK realtime session).

They share one command line (``args.peer_parser``) and one stdin/stdout protocol
with the driver: print ``STARTED`` when ready to connect, read one line
(``GO``), join every call id, print ``JOINED``, and exit when every call has
ended, stdin closes, or ``--max-seconds`` passes.
"""
