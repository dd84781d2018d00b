"""OpenAI Realtime: event models (``events``), the sideband websocket
(``sideband``) and a local simulator of the service (``simulator``).

Submodules are imported explicitly by their users; importing this package
imports nothing heavy.
"""
