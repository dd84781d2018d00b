"""OpenAI Realtime, our side of it: event models (``events``), the sideband
websocket (``sideband``) and the session settings a journal chooses
(``session_settings``, in the foundation layer: the journal's configuration
reads it). The stand-in for the service is ``voiceactors.simulator``.

Submodules are imported explicitly by their users; importing this package
imports nothing heavy.
"""
