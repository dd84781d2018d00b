"""The commitments ledger: derivation rules, listing, and the one write (close).

The fixture journal has no commitments, so these tests write their own
activity files with the small writers below.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from voiceactors import storage
from voiceactors.journal import ledger
from voiceactors.journal.paths import InvalidName

T0 = 1_772_000_000_000  # ms
DAY_MS = 86_400_000


# --- writers -----------------------------------------------------------------


def write_facet(root: Path, slug: str, *, muted: bool = False) -> None:
    folder = root / "facets" / slug
    (folder / "activities").mkdir(parents=True, exist_ok=True)
    (folder / "facet.json").write_text(json.dumps({"title": slug.title(), "muted": muted}))


def write_day(root: Path, facet: str, day: str, records: list[dict], *, raw: list[str] = ()) -> Path:
    """Write ``facets/<facet>/activities/<day>.jsonl`` (``raw`` lines appended verbatim)."""
    if not (root / "facets" / facet / "facet.json").exists():
        write_facet(root, facet)
    path = root / "facets" / facet / "activities" / f"{day}.jsonl"
    lines = [json.dumps(r) for r in records] + list(raw)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def commitment(action: str, *, owner: str = "Me", owner_id: str | None = "me",
               counterparty: str | None = "Bob", counterparty_id: str | None = "bob", **extra) -> dict:
    out = {"owner": owner, "owner_entity_id": owner_id, "action": action,
           "counterparty": counterparty, "counterparty_entity_id": counterparty_id}
    out.update(extra)
    return out


def closure(action: str, *, owner_id: str | None = "me", counterparty: str | None = "Bob",
            counterparty_id: str | None = "bob") -> dict:
    return {"owner_entity_id": owner_id, "counterparty": counterparty,
            "counterparty_entity_id": counterparty_id, "action": action}


def record(rid: str, created_at: int, *, commitments=(), closures=(), edits=None) -> dict:
    out = {"id": rid, "activity": "meeting", "created_at": created_at,
           "commitments": list(commitments), "closures": list(closures)}
    if edits is not None:
        out["edits"] = edits
    return out


def manual(item_id: str, as_state: str, timestamp: str, note: str = "") -> dict:
    return {"timestamp": timestamp, "actor": "cli", "fields": ["ledger_close"], "note": note,
            "ledger_close": {"item_id": item_id, "as_state": as_state}}


def by_action(root: Path) -> dict[str, ledger.LedgerItem]:
    return {item.action: item for item in ledger.derive(root)}


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    root = tmp_path / "journal"
    root.mkdir()
    write_facet(root, "work")
    return root


# --- derivation --------------------------------------------------------------------


def test_item_id_is_sha256_of_ids_and_normalized_action(journal):
    write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("  Send   the DECK ")])])
    (item,) = ledger.derive(journal)
    expected = hashlib.sha256(b"me|send the deck|bob").hexdigest()[:16]
    assert item.id == expected == ledger.item_id("me", "send the deck", "bob")
    assert item.action == "Send   the DECK"  # displayed as written (trimmed), matched normalized
    assert item.state == "open" and item.closed_at is None and item.opened_at == T0
    assert item.facet == "work"
    assert item.sources == (ledger.SourceRef("work", "20260301", "a_1", "commitments"),)


def test_missing_entity_ids_hash_as_empty_strings(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("call mom", owner_id=None, counterparty_id=None)])])
    (item,) = ledger.derive(journal)
    assert item.id == hashlib.sha256(b"|call mom|").hexdigest()[:16]
    assert item.owner_entity_id is None and item.counterparty_entity_id is None


def test_blank_owner_or_action_is_skipped(journal):
    write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[
        commitment("   "), commitment("book flights", owner=""), "not a dict", commitment("real one")])])
    assert [i.action for i in ledger.derive(journal)] == ["real one"]


def test_same_id_in_several_records_is_one_item_with_earliest_fields(journal):
    write_facet(journal, "home")
    # The later file holds the earlier record: order is by created_at, not file.
    write_day(journal, "work", "20260305", [
        record("a_9", T0 + 5 * DAY_MS, commitments=[commitment("Send the deck", context="late", when="friday")])])
    write_day(journal, "home", "20260310", [
        record("b_1", T0, commitments=[commitment("send  the deck", context="early", when="monday")])])
    (item,) = ledger.derive(journal)
    assert (item.action, item.context, item.when, item.opened_at) == ("send  the deck", "early", "monday", T0)
    assert item.facet == "home"
    assert item.sources == (
        ledger.SourceRef("home", "20260310", "b_1", "commitments"),
        ledger.SourceRef("work", "20260305", "a_9", "commitments"),
    )


def test_opening_file_is_the_day_file_a_close_writes(journal):
    # the earliest record opens the item, wherever later mentions are; a close
    # appends its edit to that file (and waits for that file's lock)
    write_facet(journal, "home")
    write_day(journal, "work", "20260305", [record("a_9", T0 + 5 * DAY_MS, commitments=[commitment("send the deck")])])
    opened = write_day(journal, "home", "20260310", [record("b_1", T0, commitments=[commitment("send the deck")])])
    (item,) = ledger.derive(journal)
    assert ledger.opening_file(journal, item.id) == opened
    before = (journal / "facets" / "work" / "activities" / "20260305.jsonl").read_text()
    ledger.close(journal, item.id, "closed", "sent")
    assert "ledger_close" in opened.read_text()
    assert (journal / "facets" / "work" / "activities" / "20260305.jsonl").read_text() == before
    with pytest.raises(KeyError):
        ledger.opening_file(journal, "no-such-item")


def test_closure_worded_slightly_differently_closes(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("send the signed contract to Bob")]),
        record("a_2", T0 + 3_600_000, closures=[closure("Sent Bob the signed contract")]),
    ])
    (item,) = ledger.derive(journal)
    assert item.state == "closed"
    assert item.closed_at == T0 + 3_600_000
    assert ledger.SourceRef("work", "20260301", "a_2", "closures") in item.sources
    assert item.resolution is None


def test_unrelated_closure_does_not_close(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("send the signed contract to Bob")]),
        record("a_2", T0 + 1, closures=[closure("book flights for the offsite")]),
    ])
    assert ledger.derive(journal)[0].state == "open"


@pytest.mark.parametrize("commit_ids, close_ids, matches", [
    (("me", "bob"), ("me", "bob"), True),
    (("me", "bob"), ("you", "bob"), False),       # other owner
    (("me", "bob"), ("me", "carol"), False),      # other counterparty
    (("me", "bob"), ("me", None), False),         # only one side has a counterparty id
    ((None, "bob"), (None, "bob"), True),         # both owners missing matches
    ((None, "bob"), ("me", "bob"), False),        # only one owner id
])
def test_closure_party_rules(journal, commit_ids, close_ids, matches):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("review the budget", owner_id=commit_ids[0], counterparty_id=commit_ids[1])]),
        record("a_2", T0 + 1, closures=[closure("reviewed the budget", owner_id=close_ids[0], counterparty_id=close_ids[1])]),
    ])
    assert (ledger.derive(journal)[0].state == "closed") is matches


def test_closure_without_counterparty_ids_matches_on_normalized_names(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[
            commitment("review the budget", counterparty="Bob  Smith", counterparty_id=None),
            commitment("review the budget", counterparty="Carol", counterparty_id=None, owner_id="other")]),
        record("a_2", T0 + 1, closures=[
            closure("review the budget", counterparty="bob smith", counterparty_id=None),
            closure("review the budget", counterparty="Dave", counterparty_id=None, owner_id="other")]),
    ])
    states = {i.counterparty: i.state for i in ledger.derive(journal)}
    assert states == {"Bob  Smith": "closed", "Carol": "open"}


def test_a_closure_is_consumed_by_the_first_item_it_matches(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("send the quarterly report")]),
        record("a_2", T0 + 10, commitments=[commitment("send the quarterly reports")]),
        record("a_3", T0 + 20, closures=[closure("sent the quarterly report")]),
    ])
    items = by_action(journal)
    assert items["send the quarterly report"].state == "closed"
    assert items["send the quarterly reports"].state == "open"


def test_earliest_matched_closure_gives_closed_at(journal):
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("draft the press release")]),
        record("a_3", T0 + 300, closures=[closure("drafted the press release")]),
        record("a_2", T0 + 200, closures=[closure("draft the press release")]),
    ])
    (item,) = ledger.derive(journal)
    assert item.closed_at == T0 + 200


def test_manual_dropped_overrides_story_closure(journal):
    rid = ledger.item_id("me", "ship the beta", "bob")
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("ship the beta")],
               edits=[manual(rid, "dropped", "2026-03-02T10:00:00Z", "resolution: deferred")]),
        record("a_2", T0 + 1, closures=[closure("shipped the beta")]),
    ])
    (item,) = ledger.derive(journal)
    assert item.state == "dropped"
    assert item.closed_at == ledger.parse_timestamp_ms("2026-03-02T10:00:00Z")
    assert item.resolution == "deferred"
    fields = [s.field for s in item.sources]
    assert fields.count("closures") == 1 and fields.count("edits") == 1


def test_latest_manual_close_wins_by_timestamp_not_position(journal):
    rid = ledger.item_id("me", "renew the lease", "bob")
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("renew the lease")], edits=[
            manual(rid, "closed", "2026-03-05T09:00:00Z", "resolution: signed"),
            manual(rid, "dropped", "2026-03-03T09:00:00Z", "resolution: dropped"),
        ]),
    ])
    (item,) = ledger.derive(journal)
    assert (item.state, item.resolution) == ("closed", "signed")


def test_edits_that_are_not_ledger_closes_are_ignored(journal):
    rid = ledger.item_id("me", "renew the lease", "bob")
    bad = manual(rid, "closed", "2026-03-05T09:00:00Z")
    bad["fields"] = ["ledger_close", "title"]
    write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("renew the lease")], edits=[
            bad, manual(rid, "reopened", "2026-03-05T09:00:00Z"), {"fields": ["title"], "note": "x"}]),
    ])
    assert ledger.derive(journal)[0].state == "open"


def test_corrupt_line_is_skipped_and_logged(journal):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("call the bank")])],
                     raw=["{not json", "[1, 2]"])
    with capture_logs() as logs:
        items = ledger.derive(journal)
    assert [i.action for i in items] == ["call the bank"]
    skipped = [e for e in logs if e["event"] == "journal.jsonl_line_skipped"]
    assert [(e["file"], e["line"]) for e in skipped] == [(str(path), 2), (str(path), 3)]


def test_only_day_files_of_facets_are_read(journal):
    write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    acts = journal / "facets" / "work" / "activities"
    (acts / "activities.jsonl").write_text(json.dumps(record("t", T0, commitments=[commitment("type list")])) + "\n")
    stray = journal / "facets" / "nofacet" / "activities"
    stray.mkdir(parents=True)
    (stray / "20260301.jsonl").write_text(json.dumps(record("s", T0, commitments=[commitment("stray")])) + "\n")
    assert [i.action for i in ledger.derive(journal)] == ["one"]


# --- listing ---------------------------------------------------------------------


@pytest.fixture
def mixed(journal: Path) -> Path:
    write_facet(journal, "home")
    write_facet(journal, "quiet", muted=True)
    rid_c = ledger.item_id("me", "c pay the invoice", "bob")
    write_day(journal, "work", "20260301", [
        record("a_1", T0 + 2 * DAY_MS, commitments=[commitment("a write the report")]),
        record("a_2", T0, commitments=[commitment("b call the plumber")]),
        record("a_3", T0 + DAY_MS, commitments=[commitment("c pay the invoice")],
               edits=[manual(rid_c, "dropped", "2026-03-09T00:00:00Z")]),
        record("a_4", T0 + 3 * DAY_MS, commitments=[commitment("d book the venue")]),
        record("a_5", T0 + 4 * DAY_MS, closures=[closure("d booked the venue")]),
    ])
    write_day(journal, "home", "20260301", [record("h_1", T0 + 10, commitments=[commitment("e fix the sink")])])
    write_day(journal, "quiet", "20260301", [record("q_1", T0 - 10, commitments=[commitment("f muted thing")])])
    return journal


def test_list_open_oldest_first_and_enabled_facets_by_default(mixed):
    assert [i.action for i in ledger.list_items(mixed, state="open")] == [
        "b call the plumber", "e fix the sink", "a write the report"]


def test_list_closed_and_dropped_and_all(mixed):
    assert [i.action for i in ledger.list_items(mixed, state="closed")] == ["d book the venue"]
    assert [i.action for i in ledger.list_items(mixed, state="dropped")] == ["c pay the invoice"]
    # all: open (oldest first), then closed/dropped by closed_at, newest first
    assert [i.action for i in ledger.list_items(mixed)] == [
        "b call the plumber", "e fix the sink", "a write the report", "c pay the invoice", "d book the venue"]
    assert ledger.parse_timestamp_ms("2026-03-09T00:00:00Z") > T0 + 4 * DAY_MS


def test_list_facets_filter_and_top(mixed):
    assert [i.action for i in ledger.list_items(mixed, state="open", facets=["home"])] == ["e fix the sink"]
    assert [i.action for i in ledger.list_items(mixed, state="open", facets=["quiet"])] == ["f muted thing"]
    assert [i.action for i in ledger.list_items(mixed, top=2)] == ["b call the plumber", "e fix the sink"]
    assert ledger.list_items(mixed, top=0) == []
    assert len(ledger.list_items(mixed, top=None, facets=["work", "home", "quiet"])) == 6


def test_list_rejects_unknown_state_and_bad_facet(mixed):
    with pytest.raises(ValueError):
        ledger.list_items(mixed, state="pending")
    with pytest.raises(InvalidName):
        ledger.list_items(mixed, facets=["../etc"])


# --- caching ---------------------------------------------------------------------


class ManualClock:
    """The ledger cache's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_past_ttl(self) -> None:
        self.now += ledger.CACHE_TTL_S + 0.001


@pytest.fixture
def cache_clock(monkeypatch) -> ManualClock:
    clock = ManualClock()
    monkeypatch.setattr(ledger, "monotonic", clock)
    return clock


def test_derive_is_cached_until_a_file_changes(journal, cache_clock):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    first = ledger.derive(journal)
    again = ledger.derive(journal)
    assert again[0] is first[0]  # same objects: nothing was re-parsed
    path.write_text(path.read_text() + json.dumps(record("a_2", T0 + 1, commitments=[commitment("two")])) + "\n")
    cache_clock.advance_past_ttl()  # an in-place rewrite shows once the TTL has passed
    assert [i.action for i in ledger.derive(journal)] == ["one", "two"]
    write_day(journal, "work", "20260302", [record("a_3", T0 + 2, commitments=[commitment("three")])])
    assert len(ledger.derive(journal)) == 3


def _age(folder: Path) -> None:
    """Give ``folder`` an mtime well in the past, so that any later change to
    its entries moves it whatever the file system's timestamp granularity."""
    past = time.time_ns() - 60 * 10**9
    os.utime(folder, ns=(past, past))


def test_in_place_rewrite_shows_only_after_the_ttl(journal, cache_clock):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    assert [i.action for i in ledger.derive(journal)] == ["one"]
    path.write_text(path.read_text() + json.dumps(record("a_2", T0 + 1, commitments=[commitment("two")])) + "\n")
    cache_clock.now += ledger.CACHE_TTL_S / 2
    assert [i.action for i in ledger.derive(journal)] == ["one"]   # within the TTL: the cached items
    cache_clock.now += ledger.CACHE_TTL_S / 2
    assert [i.action for i in ledger.derive(journal)] == ["one", "two"]


def test_replaced_added_and_removed_files_show_at_once(journal, cache_clock):
    acts = journal / "facets" / "work" / "activities"
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    _age(acts)
    assert [i.action for i in ledger.derive(journal)] == ["one"]
    storage.atomic_write(path, json.dumps(record("a_1", T0, commitments=[commitment("uno")])) + "\n")
    assert [i.action for i in ledger.derive(journal)] == ["uno"]           # replaced (os.replace)
    _age(acts)
    ledger.derive(journal)
    other = write_day(journal, "work", "20260302", [record("a_2", T0 + 1, commitments=[commitment("two")])])
    assert [i.action for i in ledger.derive(journal)] == ["uno", "two"]    # added
    _age(acts)
    ledger.derive(journal)
    other.unlink()
    assert [i.action for i in ledger.derive(journal)] == ["uno"]           # removed
    _age(journal / "facets")
    ledger.derive(journal)
    write_day(journal, "home", "20260303", [record("h_1", T0 + 2, commitments=[commitment("three")])])
    assert [i.action for i in ledger.derive(journal)] == ["uno", "three"]  # a new facet


def test_close_shows_at_once_within_the_ttl(journal, cache_clock):
    write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    (item,) = ledger.derive(journal)
    closed = ledger.close(journal, item.id, "dropped", "resolution: dropped")
    assert closed.state == "dropped"
    assert ledger.derive(journal) == [closed]
    assert ledger.list_items(journal, state="open") == []
    assert ledger.list_items(journal, state="dropped") == [closed]


def _ledger_journal(root: Path) -> None:
    """Several facets and files, story closures, manual closes, shared ids."""
    write_facet(root, "home")
    for day in range(1, 7):
        write_day(root, "work", f"202603{day:02}", [
            record(f"w{day}_{k}", T0 + day * DAY_MS + k, commitments=[
                commitment(f"follow up on topic {day} {k}", counterparty_id=f"p{k % 3}"),
                commitment(f"send notes {k}", owner_id=None, counterparty_id=None, counterparty="Ann"),
            ], closures=[closure(f"followed up on topic {day - 1} {k}", counterparty_id=f"p{k % 3}")] if day > 1 else [],
            edits=[manual(ledger.item_id("me", f"follow up on topic {day - 2} {k}", f"p{k % 3}"), "dropped",
                          "2026-03-20T10:00:00Z", note="resolution: dropped")] if day > 2 and k == 1 else None)
            for k in range(4)])
        write_day(root, "home", f"202603{day:02}", [
            record(f"h{day}", T0 + day * DAY_MS + 9, commitments=[
                commitment("fix the sink"), commitment(f"call the plumber {day}", counterparty_id="plumber")])])


def _views(root: Path) -> dict[str, list[ledger.LedgerItem]]:
    every = ["home", "work"]
    return {"derive": ledger.derive(root), **{
        str(state): ledger.list_items(root, state=state, facets=every, top=None)
        for state in (None, "open", "closed", "dropped")}}


def test_close_patches_one_item_and_matches_a_full_rebuild(tmp_path, cache_clock):
    journal = tmp_path / "journal"
    _ledger_journal(journal)
    before = {i.id: i for i in ledger.derive(journal)}
    states = {i.state for i in before.values()}
    assert states == {"open", "closed", "dropped"}
    targets = [i for i in before.values() if i.state == "open"][:3] + \
        [i for i in before.values() if i.state == "closed"][:2] + [i for i in before.values() if i.state == "dropped"][:1]
    for n, item in enumerate(targets):
        ledger.close(journal, item.id, "dropped" if n % 2 else "closed", f"resolution: r{n}")
    ledger.close(journal, targets[0].id, "dropped", "resolution: changed my mind")   # a second close
    after = {i.id: i for i in ledger.derive(journal)}
    changed = {i.id for i in targets}
    # patched, not rebuilt: every other item is the very object derived before
    assert all(after[k] is before[k] for k in before if k not in changed)
    assert [after[i.id].state for i in targets] == ["dropped", "dropped", "closed", "dropped", "closed", "dropped"]
    assert after[targets[0].id].resolution == "changed my mind"
    assert after[targets[4].id].resolution == "r4" and after[targets[4].id].closed_at != before[targets[4].id].closed_at
    # exactly what a cold derivation (a copy of the journal: a fresh cache) gives
    cold = shutil.copytree(journal, tmp_path / "cold")
    assert _views(journal) == _views(cold)


def test_close_after_an_outside_change_to_the_same_file_rebuilds(journal, cache_clock):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("one")])])
    (item,) = ledger.derive(journal)
    # rewritten in place within the TTL: the cache has not seen it when we close
    path.write_text(path.read_text() + json.dumps(record("a_2", T0 + 1, commitments=[commitment("two")])) + "\n")
    ledger.close(journal, item.id, "closed", "resolution: done")
    assert [(i.action, i.state) for i in ledger.derive(journal)] == [("one", "closed"), ("two", "open")]


# --- close ---------------------------------------------------------------------------


def _edits(path: Path, rid: str) -> list[dict]:
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("id") == rid:
            return row.get("edits", [])
    raise AssertionError(rid)


def test_close_appends_edit_to_earliest_record(journal):
    write_facet(journal, "home")
    late = write_day(journal, "work", "20260301", [record("a_1", T0 + DAY_MS, commitments=[commitment("order the cake")])])
    early = write_day(journal, "home", "20260310", [record("b_1", T0, commitments=[commitment("Order the cake")])])
    (item,) = ledger.derive(journal)
    closed = ledger.close(journal, item.id, "closed", "resolution: done")
    assert (closed.state, closed.resolution, closed.id) == ("closed", "done", item.id)
    assert _edits(late, "a_1") == []
    (edit,) = _edits(early, "b_1")
    assert set(edit) == {"timestamp", "actor", "fields", "note", "ledger_close"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", edit["timestamp"])
    assert abs(ledger.parse_timestamp_ms(edit["timestamp"]) - time.time() * 1000) < 5_000
    assert edit["actor"] == "voice" and edit["fields"] == ["ledger_close"]
    assert edit["note"] == "resolution: done"
    assert edit["ledger_close"] == {"item_id": item.id, "as_state": "closed"}
    assert closed.closed_at == ledger.parse_timestamp_ms(edit["timestamp"])
    assert ledger.list_items(journal, state="closed") == [closed]


def test_close_is_idempotent_for_same_item_and_state(journal):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("water the plants")])])
    (item,) = ledger.derive(journal)
    ledger.close(journal, item.id, "dropped", "resolution: dropped", actor="tester")
    before = path.read_bytes()
    again = ledger.close(journal, item.id, "dropped", "resolution: dropped")
    assert path.read_bytes() == before
    assert again.state == "dropped"
    # a different state is a new close, and then the latest wins
    reclosed = ledger.close(journal, item.id, "closed", "resolution: done")
    assert reclosed.state == "closed" and reclosed.resolution == "done"
    assert [e["ledger_close"]["as_state"] for e in _edits(path, "a_1")] == ["dropped", "closed"]
    assert _edits(path, "a_1")[0]["actor"] == "tester"


def test_close_of_story_closed_item_still_writes_manual_close(journal):
    path = write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("ship the beta")]),
        record("a_2", T0 + 1, closures=[closure("shipped the beta")]),
    ])
    (item,) = ledger.derive(journal)
    assert item.state == "closed"
    dropped = ledger.close(journal, item.id, "dropped", "resolution: dropped")
    assert dropped.state == "dropped" and len(_edits(path, "a_1")) == 1


def test_close_unknown_item_and_bad_state(journal):
    write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("x")])])
    (item,) = ledger.derive(journal)
    with pytest.raises(KeyError):
        ledger.close(journal, "0123456789abcdef", "closed", "resolution: done")
    with pytest.raises(ValueError):
        ledger.close(journal, item.id, "open", "resolution: done")


def test_two_concurrent_closes_in_same_file_both_land(journal):
    actions = [f"follow up on thread {k}" for k in range(6)]
    path = write_day(journal, "work", "20260301", [
        record(f"a_{k}", T0 + k, commitments=[commitment(a)]) for k, a in enumerate(actions)])
    ids = [i.id for i in ledger.derive(journal)]
    barrier = threading.Barrier(len(ids))
    errors: list[BaseException] = []

    def worker(item_id: str) -> None:
        try:
            barrier.wait()
            ledger.close(journal, item_id, "closed", "resolution: done")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(len(_edits(path, f"a_{k}")) == 1 for k in range(len(ids)))
    assert {i.state for i in ledger.derive(journal)} == {"closed"}


def _close_in_process(root: str, item_id: str, barrier) -> None:
    barrier.wait(20)  # both children are up before either writes
    ledger.close(Path(root), item_id, "closed", "resolution: done")


def test_concurrent_closes_from_two_processes_both_land(journal):
    path = write_day(journal, "work", "20260301", [
        record("a_0", T0, commitments=[commitment("first thing")]),
        record("a_1", T0 + 1, commitments=[commitment("second thing")]),
    ])
    ids = [i.id for i in ledger.derive(journal)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(ids))
    procs = [ctx.Process(target=_close_in_process, args=(str(journal), i, barrier)) for i in ids]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(_edits(path, "a_0")) == 1 and len(_edits(path, "a_1")) == 1


def test_crash_before_replace_leaves_file_intact(journal, monkeypatch):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("pay rent")])],
                     raw=["garbage line"])
    (item,) = ledger.derive(journal)
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        ledger.close(journal, item.id, "closed", "resolution: done")
    monkeypatch.undo()
    assert path.read_bytes() == before
    leftovers = sorted(p.name for p in path.parent.iterdir())
    assert leftovers == ["20260301.jsonl", "20260301.jsonl.lock"]  # no temp file left behind
    assert ledger.derive(journal)[0].state == "open"


def test_close_preserves_corrupt_lines_verbatim(journal):
    corrupt = ['{"id": "broken", "commitments": [', "  \tnot json at all  "]
    path = write_day(journal, "work", "20260301", [
        record("a_1", T0, commitments=[commitment("mail the forms")]),
        record("a_2", T0 + 1, commitments=[commitment("other")]),
    ], raw=corrupt)
    item = by_action(journal)["mail the forms"]
    ledger.close(journal, item.id, "closed", "resolution: sent")
    lines = path.read_text().splitlines()
    assert lines[2:] == corrupt
    assert len(lines) == 4
    assert _edits(path, "a_1")[0]["ledger_close"]["item_id"] == item.id


def test_close_on_fixture_copy_with_added_commitments(fixture_copy, cache_clock):
    assert ledger.derive(fixture_copy) == []  # the fixture has no commitments
    path = fixture_copy / "facets" / "montague" / "activities" / "20260309.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows[0]["commitments"] = [commitment("send Juliet the API spec", owner="Romeo", owner_id="romeo_montague",
                                         counterparty="Juliet", counterparty_id="juliet_capulet")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache_clock.advance_past_ttl()  # rewritten in place: shows once the TTL has passed
    (item,) = ledger.list_items(fixture_copy, state="open")
    assert item.facet == "montague" and item.opened_at == rows[0]["created_at"]
    closed = ledger.close(fixture_copy, item.id, "closed", "resolution: sent")
    assert closed.state == "closed"
    assert ledger.list_items(fixture_copy, state="open") == []
    assert ledger.list_items(fixture_copy, state="closed", facets=["montague"]) == [closed]


def test_racing_identical_closes_write_once(journal):
    path = write_day(journal, "work", "20260301", [record("a_1", T0, commitments=[commitment("sign the lease")])])
    (item,) = ledger.derive(journal)
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        ledger.close(journal, item.id, "closed", "resolution: signed")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_edits(path, "a_1")) == 1
