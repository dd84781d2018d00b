"""commitments.list and commitments.complete. The fixture journal has no
commitments, so the tests write activity records into a copy of it."""

from __future__ import annotations

import json

import pytest

from voiceactors import clock, storage
from voiceactors.journal import ledger
from voiceactors.tools import REGISTRY, ToolContext

list_commitments = REGISTRY["commitments.list"].handler
complete = REGISTRY["commitments.complete"].handler

MS_2026_03_20_2330_UTC = 1774049400000    # 23:30 UTC: the UTC day, whatever the local zone


def _seed(root):
    rows = [
        {"id": "meeting_233000_300", "activity": "meeting", "segments": ["233000_300"],
         "created_at": MS_2026_03_20_2330_UTC,
         "commitments": [
             {"owner": "Me", "action": "Send the deck to Juliet", "counterparty": "Juliet Capulet",
              "counterparty_entity_id": "juliet_capulet", "when": "Friday", "context": "board prep"},
             {"owner": "Romeo Montague", "owner_entity_id": "romeo_montague", "action": "Review the API spec",
              "counterparty": None, "context": "integration"},
         ]},
    ]
    path = root / "facets" / "verona" / "activities" / "20260320.jsonl"
    storage.atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path, ledger.item_id(None, "Send the deck to Juliet", "juliet_capulet")


@pytest.fixture
def seeded(fixture_copy, tmp_path):
    path, item = _seed(fixture_copy)
    return ToolContext(fixture_copy, tmp_path / "state"), path, item


def test_list(seeded):
    ctx, _path, item = seeded
    out = list_commitments(ctx, {})
    assert len(out["commitments"]) == 2
    first = next(c for c in out["commitments"] if c["id"] == item)
    assert first == {"id": item, "owner": "Me", "action": "Send the deck to Juliet",
                     "counterparty": "Juliet Capulet", "state": "open", "context": "board prep",
                     "day_opened": "2026-03-20"}
    assert not item.startswith("lg_") and len(item) == 16
    assert "sources" not in json.dumps(out)
    assert list_commitments(ctx, {"limit": 1})["commitments"][0]["state"] == "open"
    assert len(list_commitments(ctx, {"limit": 1})["commitments"]) == 1
    assert list_commitments(ctx, {"state": "closed"}) == {"commitments": []}
    assert list_commitments(ctx, {"facet": "capulet"}) == {"commitments": []}
    assert len(list_commitments(ctx, {"facet": "verona", "state": "open"})["commitments"]) == 2


def test_a_close_on_a_pinned_day_is_stamped_on_that_day(seeded):
    """Today pinned (``--today``, a replay): the close falls on the pinned
    day, not on the machine's date (before: a close made while the journal
    was pinned to 2026-03-21 said it was closed months later)."""
    ctx, _path, item = seeded
    clock.pin("2026-03-21")
    try:
        out = complete(ctx, {"commitment_id": item, "resolution": "signed"})
    finally:
        clock.pin(None)
    assert out["commitment"]["day_closed"] == "2026-03-21"


def test_list_failure(seeded):
    ctx, _path, _item = seeded
    assert list_commitments(ctx, {"state": "pending"}) == {"error": "invalid state"}


def test_complete_closes_and_lists_resolution(seeded):
    ctx, path, item = seeded
    out = complete(ctx, {"commitment_id": item, "resolution": "signed"})
    assert out["ok"] is True
    c = out["commitment"]
    assert (c["id"], c["state"], c["resolution"]) == (item, "closed", "signed")
    assert c["day_opened"] == "2026-03-20" and len(c["day_closed"]) == 10
    assert "sources" not in json.dumps(out)
    record = json.loads(path.read_text().splitlines()[0])
    assert record["edits"][-1]["ledger_close"] == {"item_id": item, "as_state": "closed"}
    assert record["edits"][-1]["note"] == "resolution: signed"
    assert record["edits"][-1]["actor"] == "voice"
    closed = list_commitments(ctx, {"state": "closed"})["commitments"]
    assert [(x["id"], x["resolution"]) for x in closed] == [(item, "signed")]
    # the same close again writes nothing more
    complete(ctx, {"commitment_id": item, "resolution": "done"})
    record = json.loads(path.read_text().splitlines()[0])
    assert len(record["edits"]) == 1


def test_complete_dropped(seeded):
    ctx, _path, item = seeded
    out = complete(ctx, {"commitment_id": item, "resolution": "dropped"})
    assert out["commitment"]["state"] == "dropped" and out["commitment"]["resolution"] == "dropped"
    assert [x["id"] for x in list_commitments(ctx, {"state": "dropped"})["commitments"]] == [item]


def test_complete_failures(seeded):
    ctx, path, _item = seeded
    before = path.read_text()
    assert complete(ctx, {"commitment_id": "0123456789abcdef", "resolution": "done"}) == {"error": "not found"}
    assert complete(ctx, {"commitment_id": "lg_whatever", "resolution": "done"}) == {"error": "not found"}
    assert complete(ctx, {"commitment_id": "x", "resolution": "finished"}) == {"error": "invalid resolution"}
    assert path.read_text() == before


@pytest.fixture
def sample(sample_ctx):
    return sample_ctx


def test_sample_journal(sample):
    open_items = list_commitments(sample, {"state": "open", "limit": 50})["commitments"]
    assert open_items and all(c["state"] == "open" and "day_closed" not in c for c in open_items)
    dropped = list_commitments(sample, {"state": "dropped"})["commitments"]
    assert all(c["resolution"] for c in dropped)
    target = open_items[0]["id"]
    out = complete(sample, {"commitment_id": target, "resolution": "done"})
    assert out["ok"] and out["commitment"]["state"] == "closed"
    assert target not in {c["id"] for c in list_commitments(sample, {"state": "open", "limit": 50})["commitments"]}
