"""The linked context's protocol rules without I/O (as test_call_protocol.py):
the first greeting, ``journal.select`` applied to the current selection, the
``session.update`` it sends, and the original link that never changes."""

from __future__ import annotations

import json
from typing import Any

from test_call_protocol import Wire, confirmed, created, done, item_done, speech
from voiceactors.call.call_context import CallContext, Greeting, LinkedContext
from voiceactors.call.protocol import (CallProtocol, CancelOlderReads, Connected, Dropped, Publish, RecordLine,
                                              Send, StartTool, ToolAbandoned)
from voiceactors.linked_context.references import Reference, Unverified

BASE = "You are sol, the user's journal assistant."
ROMEO = Reference("entity", "romeo_montague", "Romeo Montague", entity_type="Person")
JULIET = Reference("entity", "juliet_capulet", "Juliet Capulet", entity_type="Person")
MARCH_4 = Reference("day", "2026-03-04", "Wednesday 4 March 2026", date="2026-03-04")


class ContextWire(Wire):
    """A Wire whose protocol has a linked context."""

    def __init__(self, linked: LinkedContext, connect: bool = True) -> None:
        super().__init__(connect=False)
        self.p = CallProtocol("rtc_ctx", effect_of=lambda name: "read", context=CallContext(linked))
        if connect:
            self.feed(Connected())

    @property
    def ctx(self) -> CallContext:
        assert self.p.context is not None
        return self.p.context


def sent(effects: list[Any], kind: str | None = None) -> list[dict]:
    events = [e.event for e in effects if isinstance(e, Send)]
    return [e for e in events if kind is None or e["type"] == kind]


def select_output(ref: Reference) -> str:
    return json.dumps({"selected": ref.view()})


def run_select(w: Wire, tool_call_id: str, rid: str, ref: Reference | None = None) -> None:
    """The model calls journal.select; it starts (the result is fed by the test)."""
    arguments = json.dumps({"kind": "entity", "id": (ref or JULIET).id})
    w.server(created(rid), item_done(rid, tool_call_id, "journal.select", arguments), done(rid))
    assert any(isinstance(e, StartTool) and e.tool_call_id == tool_call_id for e in w.effects)


# ------------------------------------------------------------ greeting

def test_greeting_goes_once_after_the_handover_with_the_verified_name():
    w = ContextWire(LinkedContext(BASE, ROMEO, greeting=True), connect=False)
    assert sent(w.effects) == []                       # nothing before the sideband is up
    out = w.feed(Connected())
    [update, create] = sent(out)
    assert update["type"] == "session.update" and create["type"] == "response.create"
    assert "Romeo Montague" in update["session"]["instructions"]
    opening = create["response"]["instructions"]
    assert opening.startswith(BASE) and "Romeo Montague" in opening and "Speak first" in opening
    assert "summar" in opening                          # no unsolicited summary
    assert "Speak first" not in update["session"]["instructions"]   # the opening is for that response only
    assert w.ctx.greeting == Greeting.SENT
    # the greeting is ours: its response.created is ours, and it ends with no follow-up
    w.server(created("r_greet"), done("r_greet"))
    assert w.p.batches["r_greet"].origin == "ours"
    # a drop and a reconnect: never again
    w.feed(Dropped())
    again = w.feed(Connected())
    assert sent(again, "response.create") == [] and sent(again, "session.update") == []


def test_greeting_is_dropped_when_the_conversation_already_began():
    w = ContextWire(LinkedContext(BASE, ROMEO, greeting=True), connect=False)
    w.server(speech())                                  # the user spoke before the handover
    out = w.feed(Connected())
    assert sent(out, "response.create") == []
    assert w.ctx.greeting == Greeting.DROPPED
    w.server(created("r1"), done("r1"))
    assert sent(w.feed(Connected()), "response.create") == []


def test_a_tool_call_in_the_greeting_gets_one_follow_up_after_it_is_done():
    w = ContextWire(LinkedContext(BASE, ROMEO, greeting=True))
    w.write()
    assert len(w.creates()) == 1
    # the greeting's response looks something up first
    w.server(created("r_greet"), item_done("r_greet", "c1"))
    w.finish("c1")
    w.write()
    w.server(confirmed("c1"))
    assert len(w.creates()) == 1                        # its response is still active
    w.server(done("r_greet"))
    w.write()
    assert len(w.creates()) == 2                        # one follow-up, like any batch of ours
    assert "response" not in w.creates()[1].event       # without the opening instruction


def test_refused_greeting_is_not_sent_again():
    w = ContextWire(LinkedContext(BASE, ROMEO, greeting=True))
    w.write()
    [create] = sent(w.effects, "response.create")
    w.server({"type": "error", "error": {"type": "invalid_request_error",
                                         "code": "conversation_already_has_active_response",
                                         "message": "busy", "event_id": create["event_id"]}})
    w.now += 10
    w.server(created("r_user"), done("r_user"))
    assert len(sent(w.effects, "response.create")) == 1


def test_greeting_without_a_link_or_with_an_unverified_one_names_nothing():
    for link in (None, Unverified("entity", "not_found")):
        w = ContextWire(LinkedContext(BASE, link, greeting=True))
        [create] = sent(w.effects, "response.create")
        opening = create["response"]["instructions"]
        assert "Romeo" not in opening and "Speak first" in opening
        if link is not None:
            assert "could not be" in opening
        # an unverified link still replaces the session's instruction with the note
        updates = sent(w.effects, "session.update")
        assert len(updates) == (1 if link is not None else 0)


def test_no_greeting_without_the_brains_instruction():
    w = ContextWire(LinkedContext(None, ROMEO, greeting=True))
    assert sent(w.effects) == []                  # no update either: it would erase the session's
    assert w.ctx.greeting == Greeting.DROPPED


def test_no_greeting_unless_asked():
    w = ContextWire(LinkedContext(BASE, ROMEO, greeting=False))
    assert sent(w.effects, "response.create") == []
    assert w.ctx.greeting == Greeting.NONE


# ------------------------------------------------------------ journal.select

def test_select_replaces_the_selection_and_sends_one_session_update_before_the_output():
    w = ContextWire(LinkedContext(BASE, ROMEO))
    w.write()
    assert w.ctx.selection == ROMEO and w.ctx.link == ROMEO
    run_select(w, "c1", "r1")
    out = w.finish("c1", select_output(JULIET))
    types = [e["type"] for e in sent(out)]
    assert types[:2] == ["session.update", "conversation.item.create"]
    assert types.count("session.update") == 1
    [update] = sent(out, "session.update")
    instructions = update["session"]["instructions"]
    assert instructions.startswith(BASE)
    assert "Juliet Capulet" in instructions and "Romeo Montague" in instructions   # selection and link
    assert w.ctx.selection == JULIET and w.ctx.link == ROMEO
    [publish] = [e for e in out if isinstance(e, Publish) and e.kind == "selection"]
    assert publish.fields["selection"]["id"] == "juliet_capulet"
    assert publish.fields["link"]["id"] == "romeo_montague"
    assert any(isinstance(e, RecordLine) and e.kind == "selection" for e in out)


def test_the_original_link_survives_every_select():
    w = ContextWire(LinkedContext(BASE, ROMEO))
    for n, ref in enumerate((JULIET, MARCH_4, ROMEO, JULIET)):
        run_select(w, f"c{n}", f"r{n}", ref)
        w.finish(f"c{n}", select_output(ref))
        w.write()
        w.server(confirmed(f"c{n}"), created(f"f{n}"), done(f"f{n}"))
        assert w.ctx.selection == ref and w.ctx.link == ROMEO
    assert len(sent(w.effects, "session.update")) == 1 + 4   # the handover's, then one per select


def test_failed_ambiguous_or_invalid_selects_change_nothing():
    w = ContextWire(LinkedContext(BASE, ROMEO))
    answers = [('{"error": "not found"}', "error"),
               ('{"error": "ambiguous: several entities match; ask which one, or select by id", '
                '"candidates": []}', "error"),
               ('{"error": "invalid arguments: kind must be one of day, entity, commitment, facet"}', "invalid"),
               ('{"error": "tool timed out"}', "timeout"),
               (select_output(JULIET), "rejected")]     # not "ok": the model was not told it changed
    for n, (output, outcome) in enumerate(answers):
        run_select(w, f"c{n}", f"r{n}")
        out = w.finish(f"c{n}", output, outcome)
        assert sent(out, "session.update") == []
        assert not any(isinstance(e, Publish) and e.kind == "selection" for e in out)
        assert w.ctx.selection == ROMEO


def test_reading_another_item_does_not_change_the_selection():
    w = ContextWire(LinkedContext(BASE, ROMEO))
    w.server(created("r1"), item_done("r1", "c1", "entities.get", '{"entity_slug": "juliet_capulet"}'), done("r1"))
    out = w.finish("c1", json.dumps({"slug": "juliet_capulet", "name": "Juliet Capulet"}))
    assert sent(out, "session.update") == [] and w.ctx.selection == ROMEO


def test_barge_in_during_a_select_leaves_the_selection_consistent():
    # cancelled by the barge-in: the model is told "cancelled", nothing changes
    w = ContextWire(LinkedContext(BASE, ROMEO))
    run_select(w, "c1", "r1")
    out = w.server(speech())
    assert any(isinstance(e, CancelOlderReads) for e in out)
    w.finish("c1", '{"error": "cancelled"}', "cancelled")
    assert w.ctx.selection == ROMEO and sent(w.effects, "session.update")[1:] == []
    # finished just before the cancel reached it: the output says it changed, so it did
    run_select(w, "c2", "r2")
    w.server(speech())
    out = w.finish("c2", select_output(JULIET))
    assert w.ctx.selection == JULIET
    assert [e["type"] for e in sent(out)][:2] == ["session.update", "conversation.item.create"]
    assert not any(e["type"] == "response.create" for e in sent(out))   # the user's turn owns the floor
    # abandoned (no result at all): the synthetic output, nothing changes
    run_select(w, "c3", "r3", MARCH_4)
    w.feed(ToolAbandoned("c3"))
    assert w.ctx.selection == JULIET and w.ctx.link == ROMEO


def test_a_select_finished_while_disconnected_updates_the_session_at_the_reconnect():
    w = ContextWire(LinkedContext(BASE, ROMEO))
    w.write()
    run_select(w, "c1", "r1")
    w.feed(Dropped())
    out = w.finish("c1", select_output(MARCH_4))
    assert sent(out) == [] and w.ctx.selection == MARCH_4
    again = w.feed(Connected())
    [update] = sent(again, "session.update")
    assert "Wednesday 4 March 2026" in update["session"]["instructions"]
    assert [e["type"] for e in sent(again)][:2] == ["session.update", "conversation.item.create"]


def test_a_call_without_a_link_can_select_and_has_no_link():
    w = ContextWire(LinkedContext(BASE, None))
    assert sent(w.effects) == []                        # nothing to replace at the handover
    run_select(w, "c1", "r1")
    out = w.finish("c1", select_output(MARCH_4))
    [update] = sent(out, "session.update")
    assert "original link" not in update["session"]["instructions"]
    assert w.ctx.link is None and w.ctx.selection == MARCH_4


def test_an_unverified_link_never_names_what_was_asked():
    w = ContextWire(LinkedContext(BASE, Unverified("entity", "not_found")))
    [update] = sent(w.effects, "session.update")
    assert "could not be verified" in update["session"]["instructions"]
    assert w.ctx.selection is None
