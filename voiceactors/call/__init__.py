"""The call: how a call arrives, and the typed seam between the call's shell
(``call/actor.py``) and the connection that carries its events
(``transport.py``), with the websocket sideband and an in-memory connection
behind it."""
