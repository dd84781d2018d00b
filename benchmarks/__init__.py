"""Benchmarks for voiceactors (not part of the test suite).

``python -m benchmarks`` lists them and ``python -m benchmarks run [NAME ...]
[--quick]`` runs them and rewrites the results page, docs/benchmarks.md
(``benchmarks/__main__.py``; the set and its sizes: ``benchmarks/suite.py``).

The benchmark modules (each one's docstring says what it measures and why;
each also runs alone, ``python -m benchmarks.<module> --help``): ``burst``
(the tool round at N calls, the join burst, one call, a long call),
``connect_cost``, ``capacity`` (the step-up, memory per idle call),
``redis_cost`` (scale-out), ``takeover``, ``floods``, ``journal_scale``,
``round_cpu``. The harness they share: ``common`` (child processes, CPU and
memory accounting, the sample journal), ``roundtrip`` and ``sim_host`` (a
sideband run measured at the simulator), ``lean_sim`` with ``lean_frames``
and ``lean_hosts`` (the load generator at a third of the simulator's CPU:
on two cores a costlier one measures itself), ``peers/`` (our runtime, a
whole ``serve``, the do-nothing server), ``profile_summary`` (py-spy
output as text). ``soak`` is the reliability soak (docs/reliability.md).
"""
