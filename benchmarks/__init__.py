"""Benchmarks for voiceactors (not part of the test suite; see docs/benchmarks.md).

Each script's docstring says what it measures and how to run it:
``python -m benchmarks.roundtrip``, ``benchmarks.capacity``,
``benchmarks.journal_scale``, ``benchmarks.peers_compare``.
"""
