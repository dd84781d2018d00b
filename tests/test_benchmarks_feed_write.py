"""A smoke run of ``benchmarks/feed_write.py`` with tiny sizes (no timing
asserted): every event lands, the null floor and this checkout both run,
and the Redis requests are counted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_feed_write_lands_every_event_and_counts_the_requests(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import feed_write

    out = tmp_path / "feed_write.json"
    assert feed_write.main(["--calls", "4", "--rounds", "2", "--think-s", "0.01", "0.02", "--repeats", "1",
                            "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["tree"] for r in runs] == ["null", "this"]
    null, this = runs
    assert null["events"] == this["events"] == 40 and "evals" not in null
    assert this["landed"] == 40 and this["dropped"] == 0 and 1 <= this["evals"] <= 40
