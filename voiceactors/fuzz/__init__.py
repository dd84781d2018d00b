"""``voiceactors fuzz``: a captured call replayed many times with its
schedule changed within what the service may do, each run checked against
the invariants every call keeps (``docs/testing.md`` § Fuzzing a capture)."""
