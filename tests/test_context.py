"""Linked context: the request shape, verification against the fixture and
the sample journals, the instruction text, ``journal.select``'s handler, the
tools' defaults from the current selection, and the bounded resolution time
(a journal read that hangs gives the generic conversation on time)."""

from __future__ import annotations

import datetime as dt
import errno
import json
import math
import os
import time
from pathlib import Path

import pytest
import trio

from voiceactors.linked_context import references as context
from voiceactors.executor.actor import ToolExecutor
from voiceactors.messages import ToolRequest, ask
from voiceactors.linked_context.references import ContextError, Reference, Unverified
from voiceactors.linked_context.resolve import resolve, verify
from voiceactors.journal import ledger
from voiceactors.settings import Settings
from voiceactors.tools import REGISTRY, ToolContext
from voiceactors.tools.select_tool import select

BASE = "You are sol."


# ------------------------------------------------------------ the shape

@pytest.mark.parametrize("value,message", [
    ("romeo_montague", "context must be a JSON object"),
    ([{"kind": "day"}], "context must be a JSON object"),
    ({"kind": "person", "id": "x"}, "context.kind must be one of day, entity, commitment, facet"),
    ({"id": "x"}, "context.kind must be one of day, entity, commitment, facet"),
    ({"kind": "entity"}, "context.id is required"),
    ({"kind": "entity", "id": "  "}, "context.id is required"),
    ({"kind": "entity", "id": 7}, "context.id is invalid"),
    ({"kind": "entity", "id": "../etc"}, "context.id is invalid"),
    ({"kind": "entity", "id": " romeo_montague"}, "context.id is invalid"),
    ({"kind": "entity", "id": "romeo montague"}, "context.id is invalid"),
    ({"kind": "day", "id": "2026-02-30"}, "context.id is invalid"),
    ({"kind": "day", "id": "20260304"}, "context.id is invalid"),
    ({"kind": "entity", "id": "x", "name": "Romeo"}, "context has an unknown field (allowed: kind, id)"),
])
def test_invalid_shapes_have_a_clear_message(value, message):
    with pytest.raises(ContextError) as info:
        context.parse(value)
    assert str(info.value) == message


def test_valid_shapes():
    assert context.parse({"kind": "day", "id": "2026-03-04"}) == ("day", "2026-03-04")
    assert context.parse({"id": "romeo_montague", "kind": "entity"}) == ("entity", "romeo_montague")
    # ".." passes the shape but never leaves the journal: the lookup refuses it
    assert context.parse({"kind": "facet", "id": "a..b"}) == ("facet", "a..b")
    assert context.parse({"kind": "commitment", "id": "93478d83ac54dfd6"})[0] == "commitment"


# ------------------------------------------------------------ verification

def test_dots_never_leave_the_journal(fixture_journal):
    assert verify(fixture_journal, "facet", "a..b") == Unverified("facet", "not_found")
    assert verify(fixture_journal, "entity", "..") == Unverified("entity", "not_found")


def test_each_kind_verified_on_the_fixture_journal(fixture_journal):
    assert verify(fixture_journal, "entity", "romeo_montague") == Reference(
        "entity", "romeo_montague", "Romeo Montague", entity_type="Person")
    assert verify(fixture_journal, "day", "2026-03-04") == Reference(
        "day", "2026-03-04", "Wednesday 4 March 2026", date="2026-03-04")
    assert verify(fixture_journal, "facet", "montague") == Reference("facet", "montague", "Montague Tech")
    # the fixture's ledger is empty: any commitment id is unknown
    assert verify(fixture_journal, "commitment", "93478d83ac54dfd6") == Unverified("commitment", "not_found")
    for kind, ident in (("entity", "nobody_here"), ("day", "2026-03-01"), ("facet", "nowhere")):
        assert verify(fixture_journal, kind, ident) == Unverified(kind, "not_found")


def test_each_kind_verified_on_the_sample_journal(make_sample):
    journal = make_sample(days=3)
    item = ledger.derive(journal)[0]
    opened = dt.datetime.fromtimestamp(item.opened_at / 1000, tz=dt.timezone.utc).date().isoformat()
    assert verify(journal, "commitment", item.id) == Reference("commitment", item.id, item.action, date=opened)
    assert verify(journal, "entity", "daniel_park") == Reference("entity", "daniel_park", "Daniel Park",
                                                                 entity_type="Person")
    assert verify(journal, "entity", "daniel")  == verify(journal, "entity", "daniel_park")   # an aka, for select
    assert verify(journal, "day", "2026-03-26").name == "Thursday 26 March 2026"
    assert verify(journal, "facet", "studio").kind == "facet"
    assert verify(journal, "commitment", "0000000000000000") == Unverified("commitment", "not_found")


def test_a_blocked_entity_is_never_verified(make_sample):
    journal = make_sample(days=2)
    path = journal / "entities" / "daniel_park" / "entity.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "blocked": True}))
    assert verify(journal, "entity", "daniel_park") == Unverified("entity", "not_found")


def test_an_ambiguous_name_names_only_verified_candidates(make_sample):
    journal = make_sample(days=2)
    for slug in ("daniel_park", "bluefin_capital"):
        path = journal / "entities" / slug / "entity.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "aka": ["DP"]}))
    found = verify(journal, "entity", "dp")
    assert isinstance(found, Unverified) and found.reason == "ambiguous"
    assert {c.id for c in found.candidates} == {"daniel_park", "bluefin_capital"}


def test_an_unreadable_journal_is_unverified_not_an_error(make_sample):
    journal = make_sample(days=2)
    (journal / "entities").chmod(0)
    try:
        if os.access(journal / "entities", os.R_OK):
            pytest.skip("running as root: permissions do not apply")
        found = verify(journal, "entity", "daniel")
        assert isinstance(found, Unverified)
    finally:
        (journal / "entities").chmod(0o755)


# ------------------------------------------------------------ instruction text

def test_the_instruction_names_the_verified_reference():
    ref = Reference("entity", "romeo_montague", "Romeo Montague", entity_type="Person")
    text = context.compose(BASE, ref, ref)
    assert text.startswith(BASE + "\n\n# What this conversation is about")
    assert '"Romeo Montague"' in text and 'entity id "romeo_montague"' in text
    assert "original link" in text and "journal.select" in text
    assert context.compose(BASE, None, None) == BASE      # no context: the brain's instruction as it is


def test_an_unknown_context_gives_the_generic_conversation_and_never_the_asked_name():
    text = context.compose(BASE, Unverified("entity", "not_found"), None)
    assert "could not be verified" in text
    assert "romeo" not in text.lower()
    assert "Speak first" in context.opening_instruction(Unverified("entity", "timeout"))


def test_journal_text_is_flattened_and_bounded():
    ref = Reference("commitment", "abc", context.flat("send\nthe deck\n\n# now " + "x" * 500))
    assert "\n" not in ref.name and len(ref.name) <= context.NAME_MAX


# ------------------------------------------------------------ journal.select

def test_select_handler_answers_the_verified_reference(fixture_journal, tmp_path):
    ctx = ToolContext(fixture_journal, tmp_path)
    answer = select(ctx, {"kind": "entity", "id": "Romeo Montague"})
    assert answer == {"selected": {"kind": "entity", "id": "romeo_montague", "name": "Romeo Montague",
                                   "verified": True, "type": "Person"},
                      "_nav_target": "entity/romeo_montague"}
    assert select(ctx, {"kind": "day", "id": "2026-03-04"})["_nav_target"] == "today/journal/2026-03-04"
    assert select(ctx, {"kind": "facet", "id": "nowhere"}) == {"error": "not found"}
    assert select(ctx, {"kind": "day", "id": "tomorrow"}) == {"error": "not found"}


def test_select_schema_is_in_the_registry():
    spec = REGISTRY["journal.select"]
    assert spec.effect == "read" and not spec.reusable
    assert spec.parameters["required"] == ["kind", "id"]


# ------------------------------------------------------------ defaults from the selection

async def _run(executor: ToolExecutor, name: str, args: dict, selection=None, n: int = 0):
    return await ask(executor.inbox, lambda reply: ToolRequest(
        call_id="rtc_sel", tool_call_id=f"call_{name}_{n}", name=name, arguments=json.dumps(args),
        epoch=0, turn=n, reply=reply, selection=selection), timeout=math.inf)


async def test_tools_default_this_day_and_this_person_to_the_selection(make_sample, tmp_path):
    journal = make_sample(days=3)
    settings = Settings(journal=journal, state_dir=tmp_path / "state", tool_timeout_read_s=math.inf)
    ctx = ToolContext(journal, tmp_path / "state", today=lambda: dt.date(2026, 3, 27))
    person = Reference("entity", "daniel_park", "Daniel Park")
    day = Reference("day", "2026-03-26", "Thursday 26 March 2026", date="2026-03-26")
    async with trio.open_nursery() as nursery:
        executor = ToolExecutor(settings, ctx)
        await nursery.start(executor.run)
        got = await _run(executor, "entities.get", {}, person, 1)
        assert got.outcome == "ok" and json.loads(got.output)["slug"] == "daniel_park"
        got = await _run(executor, "entities.recent_with", {"days": 7}, person, 2)
        assert got.outcome == "ok" and json.loads(got.output)["slug"] == "daniel_park"
        got = await _run(executor, "journal.get_day", {}, day, 3)
        assert got.outcome == "ok" and json.loads(got.output)["day"] == "2026-03-26"
        # an argument the model gave wins; a selection of another kind fills nothing
        got = await _run(executor, "entities.get", {"entity_slug": "bluefin_capital"}, person, 4)
        assert json.loads(got.output)["slug"] == "bluefin_capital"
        got = await _run(executor, "journal.get_day", {}, person, 5)
        assert (got.outcome, json.loads(got.output)) == ("invalid", {"error": "invalid day"})
        # no selection: what it always was
        got = await _run(executor, "entities.get", {}, None, 6)
        assert got.outcome == "invalid" and "entity_slug is required" in json.loads(got.output)["error"]
        nursery.cancel_scope.cancel()


def test_the_model_sees_the_defaulted_arguments_as_optional():
    from voiceactors.tools import manifest

    tools = {t["name"]: t for t in manifest()}
    assert tools["journal.get_day"]["parameters"]["required"] == []
    assert tools["entities.get"]["parameters"]["required"] == []
    assert tools["entities.recent_with"]["parameters"]["required"] == []
    assert tools["journal.search"]["parameters"]["required"] == ["query"]
    assert REGISTRY["journal.get_day"].parameters["required"] == ["day"]   # validation is unchanged


# ------------------------------------------------------------ bounded in time

def _hanging_entity(journal: Path, slug: str) -> Path:
    """An entity whose file is a FIFO with no writer: opening it blocks, as a
    hung network file system would."""
    folder = journal / "entities" / slug
    folder.mkdir(parents=True)
    fifo = folder / "entity.json"
    os.mkfifo(fifo)
    return fifo


def _release(fifo: Path) -> None:
    """Let the blocked reader go (it then reads an empty file). The clock
    jumped as soon as trio was idle, so the thread may reach its open() a
    little later: try until a reader is there (a few seconds at most)."""
    give_up = time.monotonic() + 5.0
    while time.monotonic() < give_up:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO   # no reader yet
            time.sleep(0.01)
            continue
        os.close(fd)
        return
    raise AssertionError("the abandoned read never reached the FIFO")


async def test_a_hanging_journal_read_gives_the_generic_conversation_on_time(make_sample, autojump_clock):
    journal = make_sample(days=2)
    fifo = _hanging_entity(journal, "stuck_person")
    try:
        started = trio.current_time()
        found = await resolve(journal, "entity", "stuck_person", 10.0)
        assert found == Unverified("entity", "timeout")
        assert trio.current_time() - started == pytest.approx(10.0, abs=0.01)
        text = context.compose(BASE, found, None)
        assert "could not be verified" in text and "stuck" not in text
    finally:
        _release(fifo)     # the abandoned thread ends (and gives its limiter token back)


async def test_a_quick_journal_read_is_not_cut_short(make_sample):
    journal = make_sample(days=2)
    found = await resolve(journal, "entity", "daniel_park", 10.0)
    assert isinstance(found, Reference) and found.name == "Daniel Park"
