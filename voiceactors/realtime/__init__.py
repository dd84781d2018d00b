"""OpenAI Realtime, our side of it: event models (``events``) and the sideband
websocket (``sideband``). The stand-in for the service is ``voiceactors.simulator``.

Submodules are imported explicitly by their users; importing this package
imports nothing heavy.
"""
