"""Read-only surfaces over a solstone journal (and the one write: ``ledger.close``).

Every function here is synchronous and blocking; async callers run them through
``voiceactors.storage.run_sync``.
"""
