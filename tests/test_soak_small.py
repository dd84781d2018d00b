"""A small soak in the suite: ``benchmarks.soak`` with 20 concurrent calls
for a few seconds (tool rounds and barge-ins), ending with the same books as
the long run — every tool call answered exactly once, no task left behind,
memory flat after the calls end, no error log line.

The long, bounded soak (hundreds of calls, minutes) is run by hand:
``.venv/bin/python -m benchmarks.soak`` (see ``docs/reliability.md``).
"""

from __future__ import annotations

from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parent.parent


async def test_small_soak_balances_its_books(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks.soak import SoakConfig, soak

    cfg = SoakConfig(concurrency=20, duration_s=0.5, max_calls=50, rounds=(1, 2), pause_s=(0.0, 0.2),
                     barge_in_share=0.3, rss_slack_mib=16.0, seed=7)
    try:
        report = await soak(cfg, workdir=tmp_path)
    finally:
        structlog.reset_defaults()      # soak() sends the logs to its own buffer
    assert report.problems == [], report.as_dict()
    assert report.calls_checked == report.calls_started >= 30
    assert report.max_live == 20
    assert report.tool_calls >= report.calls_checked and report.barge_ins > 0
    assert report.tasks_after == report.tasks_before
    assert report.rss_end_mib - report.rss_warm_mib <= 16.0
