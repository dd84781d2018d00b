"""A tool call's lifecycle as one table (``call.state.TRANSITIONS``): every
step it lists applies, every other step raises, and the protocol, driven with
any order of server events, tool answers, prefetch answers, abandoned runs,
refused outputs, drops and the close, never asks for a step the table lacks.
No sockets: the protocol rig of test_call_protocol.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from test_call_protocol import (
    Wire, args_done, confirmed, created, done, error, item_added, item_done, speech, typed_turn,
)
from voiceactors.call.protocol import (
    CancelOlderReads, Connected, Disconnected, Prefetch, Recovered, Send, StartTool, Timer, ToolAbandoned,
    ToolFinished, WrittenAtClose,
)
from voiceactors.call.state import (
    ANSWERED, TRANSITIONS, UNANSWERED, UNSTARTED, ToolCall, ToolCallEvent, ToolCallLifecycleError, ToolCallState,
    ToolOutcome, ToolRun, advance,
)

S, E = ToolCallState, ToolCallEvent
STEPS = [(state, event) for state, events in TRANSITIONS.items() for event in events]


def call_in(state: ToolCallState) -> ToolCall:
    return ToolCall("c1", "calendar.today", "r1", 0, 0, 0.0, state=state)


# ------------------------------------------------------------ the table

@pytest.mark.parametrize(("state", "event"), STEPS)
def test_every_listed_transition_applies(state: ToolCallState, event: ToolCallEvent) -> None:
    call = call_in(state)
    assert advance(call, event) == TRANSITIONS[state][event] == call.state


def test_the_table_names_every_state() -> None:
    assert list(TRANSITIONS) == list(ToolCallState)


@pytest.mark.parametrize(("state", "event"), [
    (S.SENT, E.QUEUE),            # written before it was handed to the writer
    (S.RUNNING, E.PREFETCH),      # prefetched after it started
    (S.SEEN, E.ANSWER),           # answered before it ran
    (S.CONFIRMED, E.ABANDON),     # the synthetic output after the service has the real one
    (S.CONFIRMED, E.DROP),        # a confirmed output goes back to be written again
    (S.REJECTED, E.WRITE),
    (S.PREFETCHED, E.PREFETCH_ENDED),
])
def test_an_illegal_transition_raises_naming_the_call_state_and_event(state: ToolCallState,
                                                                       event: ToolCallEvent) -> None:
    call = call_in(state)
    with pytest.raises(ToolCallLifecycleError) as raised:
        advance(call, event)
    assert str(raised.value) == f"tool call c1: no transition on '{event.value}' in state '{state.value}'"
    assert (raised.value.state, raised.value.event) == (state, event)
    assert call.state == state                    # nothing moved


def test_every_pair_not_listed_raises() -> None:
    for state in ToolCallState:
        for event in ToolCallEvent:
            if event not in TRANSITIONS[state]:
                with pytest.raises(ToolCallLifecycleError):
                    advance(call_in(state), event)


def test_the_walk_is_one_way_and_every_state_is_reachable() -> None:
    """From ``seen`` every state can be reached; a confirmed call never moves
    again and a refused one moves only to confirmed (an echo after all)."""
    reached, frontier = {S.SEEN}, [S.SEEN]
    while frontier:
        state = frontier.pop()
        for dst in TRANSITIONS[state].values():
            if dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(ToolCallState)
    assert TRANSITIONS[S.CONFIRMED] == {}
    assert set(TRANSITIONS[S.REJECTED].values()) == {S.CONFIRMED}
    # the answered states never go back to the unanswered ones
    assert not [(src, event) for src, event in STEPS if src in ANSWERED and TRANSITIONS[src][event] in UNANSWERED]


def test_the_record_names_the_states_before_the_start_seen() -> None:
    for state in UNSTARTED:
        assert call_in(state).record_fields()["state"] == "seen"
    assert call_in(S.RUNNING).record_fields()["state"] == "running"


# ------------------------------------------- the protocol, any order

class Executor:
    """The runs the protocol asked for, answered or abandoned in any order,
    each reported exactly once, as the call actor's executor would."""

    def __init__(self, w: Wire) -> None:
        self.w = w
        self.seen = 0                                # effects already looked at
        self.runs: list[tuple[str, bool, int]] = []  # (tool call id, a prefetch, epoch) in flight

    def collect(self) -> None:
        effects = self.w.effects
        while self.seen < len(effects):              # a cancelled run's report may add effects
            effect = effects[self.seen]
            self.seen += 1
            if isinstance(effect, StartTool) and not effect.prefetched:
                self.runs.append((effect.tool_call_id, False, effect.epoch))
            elif isinstance(effect, Prefetch):
                self.runs.append((effect.tool_call_id, True, effect.epoch))
            elif isinstance(effect, CancelOlderReads):
                older = [run for run in self.runs if run[2] < effect.before_epoch]
                for run in older:                    # the executor cancels them: each reports abandoned
                    self.runs.remove(run)
                    self.w.feed(ToolAbandoned(run[0], prefetch=run[1]))

    def report_prefetch(self, tool_call_id: str) -> None:
        """Answer the prefetch run of this call, if one is in flight."""
        self.collect()
        for index, (run_id, prefetch, _epoch) in enumerate(self.runs):
            if run_id == tool_call_id and prefetch:
                self.report(index, answer=True)
                return

    def report(self, pick: int, answer: bool) -> None:
        self.collect()
        if not self.runs:
            return
        tool_call_id, prefetch, _epoch = self.runs.pop(pick % len(self.runs))
        if answer:
            name = self.w.p.calls[tool_call_id].name
            self.w.feed(ToolFinished(tool_call_id, name, '{"ok": true}', "ok", 2.0, prefetch=prefetch))
        else:
            self.w.feed(ToolAbandoned(tool_call_id, prefetch=prefetch))
        self.collect()


def outputs_sent(w: Wire) -> list[Send]:
    return [e for e in w.effects if isinstance(e, Send) and e.tool_call_id is not None]


def refuse_an_output(w: Wire, pick: int) -> None:
    """The service refuses one output we sent (an ``error`` naming its event)."""
    outputs = outputs_sent(w)
    if outputs:
        w.server(error("item_already_exists", outputs[pick % len(outputs)].event["event_id"]))


def echo_an_output(w: Wire, pick: int) -> None:
    """The service echoes one output we sent (maybe once more, maybe one it refused)."""
    outputs = outputs_sent(w)
    if outputs:
        tool_call_id = outputs[pick % len(outputs)].tool_call_id
        assert tool_call_id is not None
        w.server(confirmed(tool_call_id))


# few ids, so that steps meet the same call often (two responses, two tool calls)
RIDS, TIDS = ("r1", "r2"), ("c1", "c2")
ARGS = ('{"x": 1}', '{"x": 2}')
server_steps = st.one_of(
    st.builds(lambda r: ("server", created(r)), st.sampled_from(RIDS)),
    st.builds(lambda r, c: ("server", item_added(r, c)), st.sampled_from(RIDS), st.sampled_from(TIDS)),
    st.builds(lambda r, c, a, s: ("server", item_done(r, c, arguments=a, status=s)), st.sampled_from(RIDS),
              st.sampled_from(TIDS), st.sampled_from(ARGS), st.sampled_from(["completed", "incomplete"])),
    st.builds(lambda r, c, a: ("server", args_done(r, c, a)), st.sampled_from(RIDS), st.sampled_from(TIDS),
              st.sampled_from(ARGS)),
    st.builds(lambda r, s: ("server", done(r, status=s)), st.sampled_from(RIDS),
              st.sampled_from(["completed", "completed", "cancelled", "failed", "incomplete"])),
    st.just(("server", speech())),
    st.builds(lambda c: ("server", confirmed(c)), st.sampled_from(TIDS)),
    st.just(("server", typed_turn())),
)
# one tool call's arguments in a row: done (a prefetch), its answer maybe, then final
call_steps = st.builds(lambda r, c, a, final, answered, s: ("call", (r, c, a, final, answered, s)),
                       st.sampled_from(RIDS), st.sampled_from(TIDS), st.sampled_from(ARGS), st.sampled_from(ARGS),
                       st.booleans(), st.sampled_from(["completed", "incomplete"]))
other_steps = st.one_of(
    st.builds(lambda i: ("answer", i), st.integers(0, 7)),
    st.builds(lambda i: ("abandon", i), st.integers(0, 7)),
    st.builds(lambda n: ("write", n), st.integers(1, 3)),
    st.builds(lambda i: ("refuse", i), st.integers(0, 7)),
    st.builds(lambda i: ("echo", i), st.integers(0, 7)),
    st.just(("drop", 0)),
    st.just(("timer", 0)),
)


def check_state_matches_data(w: Wire) -> None:
    """What each state implies of the call's data."""
    for call in w.p.calls.values():
        if call.state == S.PREFETCHED:
            assert call.held is not None, call
        if call.held is not None:                    # an answer kept for a start that never came
            assert call.run is None, call
        if call.state in UNSTARTED:
            assert call.run is None, call
        if call.state == S.RUNNING:
            assert call.run is not None, call
        if call.state in ANSWERED and call.state != S.CONFIRMED:   # an echo may confirm any state
            assert call.output is not None, call


@hsettings(max_examples=500, deadline=None)
@given(st.booleans(), st.lists(st.one_of(server_steps, call_steps, other_steps), max_size=50))
def test_no_order_of_inputs_asks_for_a_transition_the_table_lacks(recovered: bool, script: list[Any]) -> None:
    """Prefetches answered, abandoned or outrun by the call's start on other
    arguments, runs cancelled by a new epoch, outputs refused, sockets
    dropped and the bounded close, in any order: no input makes the protocol
    step a tool call outside ``TRANSITIONS`` (``advance`` would raise), and
    each state keeps the data it implies."""
    w = Wire(connect=not recovered)
    if recovered:      # a rejoin: one call to run again, one answered by the crashed run
        w.feed(Recovered("c_run", "calendar.today", "r_old", "{}"))
        w.feed(Recovered("c_done", "calendar.today", "r_old", "{}", '{"ok": true}', ToolOutcome.OK))
        w.feed(Connected())
    executor = Executor(w)
    for kind, arg in script:
        if kind == "server":
            w.server(arg)
        elif kind == "call":
            rid, tool_call_id, arguments, final, answered, status = arg
            w.server(created(rid), item_added(rid, tool_call_id), args_done(rid, tool_call_id, arguments))
            if answered:
                executor.report_prefetch(tool_call_id)
            w.server(item_done(rid, tool_call_id, arguments=final, status=status))
        elif kind in ("answer", "abandon"):
            executor.report(arg, answer=kind == "answer")
        elif kind == "write":
            w.write(arg)
        elif kind == "refuse":
            refuse_an_output(w, arg)
        elif kind == "echo":
            echo_an_output(w, arg)
        elif kind == "drop":
            w.drop()
            w.feed(Connected())
        else:
            w.now += 2.5
            w.feed(Timer())
        executor.collect()
        check_state_matches_data(w)
    executor.collect()
    while executor.runs:                              # every run reports before the close
        executor.report(0, answer=True)
    w.write()
    w.feed(Disconnected())
    for send in w.p.closing_outputs(w.now):
        w.effects.append(send)
        assert send.tool_call_id is not None
        w.feed(WrittenAtClose(send.tool_call_id))
    check_state_matches_data(w)
    assert not w.p.tools_running()
    assert all(call.state in (S.SENT, S.CONFIRMED, S.REJECTED) for call in w.p.calls.values())
    prefetched = [c for c in w.p.calls.values() if c.run in (ToolRun.PREFETCH, ToolRun.PREFETCH_ANSWERED)]
    assert all(c.adopted and c.prefetch == c.arguments for c in prefetched)
