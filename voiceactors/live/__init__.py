"""Live calls: the journal through OpenAI's Live voice API (``docs/live.md``).

A Live call is a call of another kind behind the call layer's seam: its
sideband speaks Live (``translate.py`` turns it into the Realtime events the
call's protocol handles, and back), its tools are declared to the session's
Responses delegation under names that API accepts (``names.py``).
"""
