"""The handoff between agents without I/O (as test_call_protocol.py): each
ownership rule of ``call/handoff.py`` as a protocol test. The service is
played event by event; the sends are read in the order the writer gets them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from test_call_protocol import Wire, args_done, confirmed, created, done, error, item_done, speech
from voiceactors.agents import DEFAULT_AGENTS, Agent, Agents, CallAgents
from voiceactors.call.call_context import CallContext, LinkedContext
from voiceactors.call.protocol import ACTIVE_RESPONSE, CallProtocol, Connected, Prefetch, Publish, PublishKind, Send
from voiceactors.tools.registry import REGISTRY, manifest

BASE = "You are sol, the user's journal assistant."
#: The service's acknowledgement of a session.update (it carries no event id).
ACK = {"type": "session.updated", "session": {"type": "realtime"}}
WRITES = {"commitments.complete"}
#: Two agents: ``front`` has the write tool and hands to ``back``; ``back`` hands to nobody.
FRONT_BACK = Agents((
    Agent("front", "Front desk.", "", frozenset({"journal.search", "commitments.complete"}), None, ("back",)),
    Agent("back", "Back office.", "", frozenset({"journal.search"}), None, ()),
))


def call_agents(agents: Agents = DEFAULT_AGENTS, in_charge: str | None = None) -> CallAgents:
    ours = manifest("dotted")
    return CallAgents(agents, tuple(ours), "dotted", {t["name"]: n for t, n in zip(ours, REGISTRY)},
                      in_charge or agents.first.name)


class HandoffWire(Wire):
    """A Wire whose call has agents (``DEFAULT_AGENTS`` unless told)."""

    def __init__(self, agents: Agents = DEFAULT_AGENTS, base: str | None = BASE, connect: bool = True) -> None:
        super().__init__(connect=False)
        context = CallContext(LinkedContext(base, agents=call_agents(agents)))
        self.p = CallProtocol("rtc_handoff", effect_of=lambda name: "write" if name in WRITES else "read",
                              context=context)
        if connect:
            self.feed(Connected())

    @property
    def agent(self) -> str | None:
        assert self.p.context is not None
        return self.p.context.agent

    def sends(self) -> list[dict[str, Any]]:
        return [e.event for e in self.of(Send)]

    def updates(self) -> list[dict[str, Any]]:
        return [e for e in self.sends() if e["type"] == "session.update"]

    def kinds(self) -> list[str]:
        """The sends in order, each named: an output by its tool call, else its type."""
        return [f"output:{e['item']['call_id']}" if e.get("item", {}).get("type") == "function_call_output"
                else e["type"] for e in self.sends()]

    def handoff_lines(self) -> list[tuple[str, str]]:
        return [(line["to"], line["status"]) for line in self.records("handoff")]


def handoff_turn(w: Wire, rid: str = "r1", hid: str = "h1", to: str = "planner",
                 business: tuple[str, ...] = (), handoff_first: bool = False) -> None:
    """One response calling ``business`` tools (``journal.search``) and the handoff, then its done."""
    items = [item_done(rid, cid, "journal.search") for cid in business]
    handoff = item_done(rid, hid, f"handoff.{to}")
    w.server(created(rid), *([handoff, *items] if handoff_first else [*items, handoff]), done(rid))


def output_of(w: Wire, tool_call_id: str) -> dict[str, Any]:
    (out,) = w.outputs(tool_call_id)
    return dict(json.loads(out.event["item"]["output"]))


# ---------------------------------------------------------------- the handoff

def test_a_handoff_updates_the_session_once_and_the_new_agent_speaks_first():
    w = HandoffWire()
    handoff_turn(w)
    assert w.started() == []                                  # never the executor's
    assert w.kinds() == ["session.update", "output:h1"]
    (update,) = w.updates()
    tools = [t["name"] for t in update["session"]["tools"]]
    assert "commitments.complete" in tools and tools[-2:] == ["handoff.assistant", "handoff.researcher"]
    assert "handoff.planner" not in tools
    assert update["session"]["instructions"].startswith(BASE)
    assert "You are the planner agent" in update["session"]["instructions"]
    assert output_of(w, "h1") == {"handed_to": "planner", "from": "assistant"}
    assert w.agent == "planner"                               # claimed in the step that sent the update
    w.write()
    (create,) = w.creates()
    words = create.event["response"]["instructions"]
    assert "You are the planner agent" in words and "taken over this call from the assistant agent" in words
    w.write()
    w.server(confirmed("h1"), ACK, created("r2"))
    assert w.handoff_lines() == [("planner", "updating")]
    w.server(done("r2"))
    assert w.handoff_lines() == [("planner", "updating"), ("planner", "done")]
    assert w.p.handoffs is not None and w.p.handoffs.current is None
    # the record says which agent spoke each response
    assert [(r["response_id"], r["agent"]) for r in w.records("response")] == [("r1", "assistant"), ("r2", "planner")]
    assert len(w.updates()) == 1
    # the feed hears who is in charge: at the call's first response, then once the update went
    assert [(e.fields["agent"], e.fields["previous"], e.fields["status"]) for e in w.of(Publish)
            if e.kind == PublishKind.AGENT] == [("assistant", None, "start"), ("planner", "assistant", "updating")]


@pytest.mark.parametrize("handoff_first", [False, True], ids=["business_first", "handoff_first"])
def test_every_business_output_is_written_before_the_handoffs_session_update(handoff_first):
    w = HandoffWire()
    handoff_turn(w, business=("c1", "c2"), handoff_first=handoff_first)
    assert w.started() == ["c1", "c2"] and w.updates() == []     # the business calls run first
    w.finish("c2")
    w.finish("c1")
    assert w.updates() == []                                     # queued is not written
    w.write(1)
    assert w.updates() == []
    w.write()
    assert w.kinds() == ["output:c2", "output:c1", "session.update", "output:h1", "response.create"]


def test_a_handoff_is_never_prefetched():
    w = HandoffWire()
    w.server(created("r1"), args_done("r1", "h1", "{}", name="handoff.planner"))
    assert w.of(Prefetch) == []
    w.server(item_done("r1", "h1", "handoff.planner"), done("r1"))
    assert w.started() == [] and len(w.updates()) == 1


def test_the_handoffs_batch_waits_for_its_response_to_end():
    w = HandoffWire()
    w.server(created("r1"), item_done("r1", "h1", "handoff.planner"))
    assert w.updates() == [] and w.agent == "assistant"        # more calls may come before its done
    w.server(item_done("r1", "c1", "journal.search"), done("r1"))
    assert w.updates() == []
    w.finish("c1")
    w.write()
    assert w.kinds()[:3] == ["output:c1", "session.update", "output:h1"]


# ------------------------------------------------------- barge-in keeps effects

def test_a_barge_in_during_the_handoffs_words_keeps_the_committed_effects():
    w = HandoffWire(FRONT_BACK)
    w.server(created("r1"), item_done("r1", "c1", "commitments.complete"), item_done("r1", "h1", "handoff.back"),
             done("r1"))
    w.finish("c1")
    w.write()
    w.write()
    w.server(confirmed("c1"), confirmed("h1"), ACK, created("r2"))
    w.server(speech(), done("r2", "cancelled"))
    # the write stays done: its output confirmed, never sent again nor abandoned; the handoff is carried through
    assert w.state("c1") == "confirmed" and len(w.outputs("c1")) == 1
    assert w.agent == "back" and w.handoff_lines()[-1] == ("back", "done")
    # the cut reply reported the write: the model is told it was done
    (note,) = [e for e in w.sends() if e.get("item", {}).get("role") == "system"]
    assert "Done: commitments.complete" in note["item"]["content"][0]["text"]


def test_a_barge_in_before_the_handoff_went_still_hands_over_without_words_of_its_own():
    w = HandoffWire(FRONT_BACK)
    w.server(created("r1"), item_done("r1", "c1", "commitments.complete"), item_done("r1", "h1", "handoff.back"),
             done("r1"))
    w.server(speech())                      # the user speaks while the write runs: its batch is superseded
    w.finish("c1")                          # a started write finishes and its output is written
    w.write()
    assert w.kinds() == ["output:c1", "session.update", "output:h1"]
    w.write()
    assert w.creates() == []                # the user's turn owns the floor: no words of the transition
    w.server(ACK)
    assert w.agent == "back" and w.handoff_lines()[-1] == ("back", "done")


def test_a_handoff_in_a_response_cut_short_is_not_carried_out():
    w = HandoffWire()
    w.server(created("r1"), item_done("r1", "h1", "handoff.planner"), speech(), done("r1", "cancelled"))
    assert w.updates() == [] and w.agent == "assistant"
    assert output_of(w, "h1") == {"error": "cancelled: the user interrupted"}
    assert w.handoff_lines() == [("planner", "refused")]


# ------------------------------------------- an old response completes nothing

def test_a_late_response_taken_for_the_handoffs_cannot_complete_it():
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    (first,) = w.creates()
    w.write()
    # the old agent's response started before the service read our create: taken for ours, then refused
    w.server(ACK, created("r_old"),
             error(ACTIVE_RESPONSE, first.event["event_id"]), done("r_old"))
    assert w.p.handoffs is not None and w.p.handoffs.current is not None      # not completed by it
    assert w.handoff_lines() == [("planner", "updating")]
    second = w.creates()[-1]
    assert second is not first and "taken over this call" in second.event["response"]["instructions"]
    w.write()
    w.server(created("r2"), done("r2"))
    assert w.handoff_lines()[-1] == ("planner", "done")


def test_a_response_the_model_started_after_the_handoffs_output_carries_it():
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    (first,) = w.creates()
    w.write()
    # the service applied the update and echoed the output, then started a response of its own first
    w.server(ACK, confirmed("h1"), created("r_model"), error(ACTIVE_RESPONSE, first.event["event_id"]))
    assert w.p.batches["r1"].follow_up == "model" and len(w.creates()) == 1     # it speaks for the batch
    assert w.p.handoffs is not None and w.p.handoffs.current is not None       # not done before it ends
    w.server(done("r_model"))
    assert w.handoff_lines()[-1] == ("planner", "done")
    assert w.p.batches["r_model"].agent == "planner"


def test_a_handoff_called_by_the_old_agents_response_is_refused():
    w = HandoffWire()
    w.server(created("r0"))                               # the assistant's response, still on
    handoff_turn(w)                                       # another of the assistant's hands over
    w.write()
    w.server(ACK)
    w.server(item_done("r0", "h0", "handoff.researcher"), done("r0"))
    assert output_of(w, "h0") == {"error": "the assistant agent is no longer in charge: planner is"}
    assert w.agent == "planner" and len(w.updates()) == 1


# ------------------------------------------- acknowledgement and completion

@pytest.mark.parametrize("ack_first", [True, False], ids=["ack_then_done", "done_then_ack"])
def test_the_acknowledgement_and_the_completion_in_either_order(ack_first):
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    w.write()
    ack = ACK
    events = [ack, created("r2"), done("r2")] if ack_first else [created("r2"), done("r2"), ack]
    w.server(*events[:2])
    assert w.p.handoffs is not None and w.p.handoffs.current is not None
    w.server(events[2])
    assert w.p.handoffs.current is None and w.handoff_lines()[-1] == ("planner", "done")
    assert w.agent == "planner"


def test_the_acknowledgement_of_an_earlier_update_is_not_the_handoffs():
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    w.write()
    # a selection's update went before (the context's, in flight): its ack comes first
    assert w.p.handoffs is not None
    w.p.handoffs.updates.appendleft("evt_earlier")
    w.server(created("r2"), done("r2"), ACK)
    assert w.p.handoffs.current is not None
    w.server(ACK)
    assert w.p.handoffs.current is None


# ------------------------------------------------------------ one at a time

def test_a_handoff_during_a_handoff_is_refused_never_interleaved():
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    w.write()
    # the new agent's words hand over again before the first handoff is acknowledged
    w.server(created("r2"), item_done("r2", "h2", "handoff.researcher"), done("r2"))
    assert output_of(w, "h2") == {"error": "another handoff is under way; planner will be in charge, "
                                           "do not call it again now"}
    assert len(w.updates()) == 1 and w.agent == "planner"
    assert w.handoff_lines() == [("planner", "updating"), ("researcher", "refused")]
    w.write()
    w.server(ACK)
    assert w.handoff_lines()[-1] == ("planner", "done")
    # once it is over, a handoff goes again
    handoff_turn(w, rid="r4", hid="h4", to="researcher")
    w.write()
    assert len(w.updates()) == 2 and w.agent == "researcher"


def test_two_handoffs_in_one_response_the_first_wins():
    w = HandoffWire()
    w.server(created("r1"), item_done("r1", "h1", "handoff.planner"), item_done("r1", "h2", "handoff.researcher"),
             done("r1"))
    assert output_of(w, "h2")["error"].startswith("another handoff is under way")
    w.write()
    assert len(w.updates()) == 1 and w.agent == "planner"


def test_a_handoff_to_an_agent_not_its_own_to_hand_to_is_refused():
    w = HandoffWire(FRONT_BACK)
    handoff_turn(w, to="back")
    w.write()
    w.write()
    w.server(ACK, created("r2"), done("r2"))
    handoff_turn(w, rid="r3", hid="h3", to="front")           # back hands to nobody
    assert output_of(w, "h3") == {"error": "the back agent cannot hand the call to front"}
    assert w.agent == "back" and len(w.updates()) == 1


# ------------------------------------------------------------ a refused update

@pytest.mark.parametrize("words_began", [False, True], ids=["before_its_words", "during_its_words"])
def test_a_refused_update_leaves_the_old_agent_in_charge_and_says_so(words_began):
    w = HandoffWire()
    handoff_turn(w)
    (update,) = w.updates()
    w.write()
    w.write()
    if words_began:
        w.server(created("r2"))
    w.server(error("invalid_value", update["event_id"]))
    assert w.agent == "assistant"
    assert w.handoff_lines() == [("planner", "updating"), ("planner", "failed")]
    assert w.p.handoffs is not None and w.p.handoffs.current is None
    if not words_began:
        w.server(created("r2"))
    # the new agent's words (speaking as the agent refused) are cancelled
    assert [e["response_id"] for e in w.sends() if e["type"] == "response.cancel"] == ["r2"]
    w.write()
    w.server(done("r2", "cancelled"))
    w.write()
    said = w.creates()[-1].event["response"]["instructions"]
    assert "You are the assistant agent" in said and "Handing the call to the planner agent did not work" in said
    assert w.logs("call.handoff_failed")[0]["code"] == "invalid_value"
    assert [e.fields["agent"] for e in w.of(Publish) if e.kind == PublishKind.AGENT] == [
        "assistant", "planner", "assistant"]


def test_an_update_unacknowledged_at_a_drop_is_sent_again():
    w = HandoffWire()
    handoff_turn(w)
    w.write()
    w.drop()
    w.feed(Connected())
    updates = w.updates()
    assert len(updates) == 2 and updates[0]["session"] == updates[1]["session"]
    assert updates[0]["event_id"] != updates[1]["event_id"]
    w.write()
    w.server(ACK, created("r2"), done("r2"))
    assert w.handoff_lines()[-1] == ("planner", "done")


def test_a_call_without_agents_has_no_handoff():
    w = Wire()
    w.server(created("r1"), item_done("r1", "h1", "handoff.planner"), done("r1"))
    assert w.started() == ["h1"]            # an unknown tool, the executor's to refuse, as before
    assert w.p.handoffs is None
