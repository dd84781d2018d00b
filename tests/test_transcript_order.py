"""Transcripts in spoken order, at the protocol: server events in the order
the service really sends them (a user's transcription completes after the
reply it prompted), the ``transcript`` record lines sorted by their
``order``; then the same end to end, over the simulator delivering user
transcripts late as the service does."""

from __future__ import annotations

import json
from typing import Any

from calls_support import rig, steady
from voiceactors.call.protocol import CallProtocol, Connected, Received, RecordLine
from voiceactors.call.transcript_order import TranscriptOrder
from voiceactors.http.history import call_detail, spoken_transcript
from voiceactors.realtime.events import parse_server_event


def ev(obj: dict) -> Any:
    parsed = parse_server_event(json.dumps({"event_id": "ev", **obj}))
    assert parsed is not None, obj
    return parsed


def user_item(item_id: str, previous: str | None) -> dict:
    return {"type": "conversation.item.added", "previous_item_id": previous,
            "item": {"id": item_id, "type": "message", "role": "user", "status": "completed",
                     "content": [{"type": "input_audio", "transcript": None}]}}


def user_text(item_id: str, text: str) -> dict:
    return {"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id,
            "content_index": 0, "transcript": text, "usage": {"type": "duration", "seconds": 1.0}}


def reply(rid: str, item_id: str, previous: str, text: str, *, cancelled: bool = False,
          transcript_after_done: bool = False) -> list[dict]:
    """A spoken reply's events as the service orders them."""
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    transcript = {"type": "response.output_audio_transcript.done", "response_id": rid, "item_id": item_id,
                  "output_index": 0, "content_index": 0, "transcript": text}
    status = "cancelled" if cancelled else "completed"
    done = {"type": "response.done", "response": {
        "id": rid, "status": status, "output": [{**item, "status": "incomplete" if cancelled else "completed"}],
        **({"status_details": {"type": "cancelled", "reason": "turn_detected"}} if cancelled else {})}}
    events = [{"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
              {"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item},
              {"type": "conversation.item.added", "previous_item_id": previous, "item": item}]
    return events + ([done, transcript] if transcript_after_done else [transcript, done])


def run(events: list[dict]) -> list[dict]:
    """Feed the events; return the record lines (kind included) in arrival order."""
    p = CallProtocol("rtc_order")
    p.handle(Connected(), 0.0)
    lines = []
    for i, obj in enumerate(events):
        for effect in p.handle(Received(ev(obj)), float(i)):
            if isinstance(effect, RecordLine) and effect.kind.startswith("transcript"):
                lines.append({"kind": effect.kind, **effect.fields})
    return lines


def texts(entries: list[dict]) -> list[str]:
    return [e["text"] for e in entries]


def test_a_late_user_transcript_is_put_before_the_reply_it_prompted():
    events = [
        user_item("u1", None), *reply("r1", "a1", "u1", "Hello, how can I help?"),
        user_text("u1", "Hi there"),                                   # late: after the reply
        user_item("u2", "a1"), *reply("r2", "a2", "u2", "You have two meetings."),
        user_text("u2", "What is on today?"),
    ]
    lines = run(events)
    transcripts = [line for line in lines if line["kind"] == "transcript"]
    # arrival order differs from spoken order: the test is about something
    assert texts(transcripts) == ["Hello, how can I help?", "Hi there", "You have two meetings.",
                                  "What is on today?"]
    spoken = sorted(transcripts, key=lambda line: line["order"])
    assert [(line["role"], line["text"]) for line in spoken] == [
        ("user", "Hi there"), ("assistant", "Hello, how can I help?"),
        ("user", "What is on today?"), ("assistant", "You have two meetings.")]
    # the history API reads the same order out of the record lines
    assert texts(spoken_transcript([{"kind": "start", "t": 0}, *lines])) == texts(spoken)


def test_a_barged_in_reply_is_marked_cut_short():
    events = [
        user_item("u1", None), *reply("r1", "a1", "u1", "Let me look that up and then", cancelled=True),
        user_item("u2", "a1"), user_text("u1", "Search for the offsite."),
        *reply("r2", "a2", "u2", "Sure.", cancelled=True, transcript_after_done=True),
        user_text("u2", "Never mind."),
    ]
    lines = run(events)
    # the transcript was written before the response.done said cancelled: a later line marks it
    assert {"kind": "transcript_cut", "item_id": "a1"} in lines
    # a transcript that comes after its response was cancelled carries the mark itself
    (late,) = [line for line in lines if line.get("item_id") == "a2" and line["kind"] == "transcript"]
    assert late["cut_short"] is True
    entries = spoken_transcript([{"kind": "start", "t": 0}, *lines])
    assert [(e["text"], e["cut_short"]) for e in entries] == [
        ("Search for the offsite.", False), ("Let me look that up and then", True),
        ("Never mind.", False), ("Sure.", True)]


def test_a_completed_reply_is_not_cut_short():
    lines = run([user_item("u1", None), *reply("r1", "a1", "u1", "Done."), user_text("u1", "Go")])
    assert not [line for line in lines if line["kind"] == "transcript_cut"]
    assert [e["cut_short"] for e in spoken_transcript(lines)] == [False, False]


def test_an_item_inserted_after_an_earlier_one_gets_a_number_between_its_neighbours():
    order = TranscriptOrder()
    for obj in (user_item("u1", None), user_item("u2", "u1"), user_item("x", "u1")):
        order.observe(ev(obj))
    numbers = {i: order.order_of(i) for i in ("u1", "x", "u2")}
    assert numbers["u1"] < numbers["x"] < numbers["u2"]
    # numbers given never change, so lines already written keep their place
    assert numbers == {"u1": 1.0, "x": 1.5, "u2": 2.0}


def test_an_unknown_predecessor_or_an_unannounced_item_goes_last():
    order = TranscriptOrder()
    order.observe(ev(user_item("u1", None)))
    order.observe(ev(user_item("u2", "lost_in_a_drop")))
    assert order.place_transcript("never_announced") == {"order": 3.0}
    assert order.order_of("u2") == 2.0


def test_runs_of_one_record_stay_in_their_order():
    """A record holds one block per actor run; order numbers restart per run."""
    lines = [
        {"kind": "start", "t": 0}, {"kind": "transcript", "role": "assistant", "text": "b", "order": 2.0},
        {"kind": "transcript", "role": "user", "text": "a", "order": 1.0},
        {"kind": "start", "t": 0}, {"kind": "transcript", "role": "user", "text": "c", "order": 1.0},
    ]
    assert texts(spoken_transcript(lines)) == ["a", "b", "c"]


def test_old_records_without_order_keep_arrival_order():
    lines = [{"kind": "start"}, {"kind": "transcript", "role": "user", "text": "x"},
             {"kind": "transcript", "role": "assistant", "text": "y"}]
    assert texts(spoken_transcript(lines)) == ["x", "y"]


# ------------------------------------------------------- end to end

LATE_SCENARIO = [
    {"user_turn": {"text": "What is on today?", "transcript_delay_ms": 1500}},
    {"response": {"text": "Let me check.", "tool_calls": [{"name": "calendar.today"}]}},
    {"wait_outputs": {}},
    {"response": {"text": "You have a quiet day."}},
    {"user_turn": {"text": "Search for the offsite.", "transcript_delay_ms": 900}},
    {"response": {"text": "Searching your journal now", "hold_s": 2.0}},
    {"barge_in": {"after_ms": 300, "text": "Never mind."}},
    {"response": {"text": "Sure."}},
    {"sleep": 2.0},
    {"close": 1000},
]


async def test_the_record_and_the_history_keep_spoken_order_over_the_simulator(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sim_call = await r.run_call("rtc_spoken", steady(LATE_SCENARIO))
    assert sim_call.error_codes == [] and sim_call.violations == [], (sim_call.error_codes, sim_call.violations)
    # the simulator delivered the user's transcripts after the replies they prompted
    sent = [e for e in sim_call.sent if e["type"] in (
        "conversation.item.input_audio_transcription.completed", "response.output_audio_transcript.done")]
    arrival = [e["transcript"] for e in sent]
    assert arrival.index("What is on today?") > arrival.index("Let me check.")
    assert arrival.index("Search for the offsite.") > arrival.index("Searching your journal now")
    # and every item it added named the one before it
    added = [e for e in sim_call.sent if e["type"] == "conversation.item.added"]
    assert added[0]["previous_item_id"] is None
    assert [e["previous_item_id"] for e in added[1:]] == [e["item"]["id"] for e in added[:-1]]

    record = r.record("rtc_spoken")
    in_file = [line["text"] for line in record if line["kind"] == "transcript"]
    assert in_file == arrival          # the file is written as the call goes: arrival order
    detail = call_detail(r.settings.state_dir, "rtc_spoken")
    assert [(e["role"], e["text"], e["cut_short"]) for e in detail["transcript"]] == [
        ("user", "What is on today?", False),
        ("assistant", "Let me check.", False),
        ("assistant", "You have a quiet day.", False),
        ("user", "Search for the offsite.", False),
        ("assistant", "Searching your journal now", True),
        ("user", "Never mind.", False),
        ("assistant", "Sure.", False),
    ]


def test_the_protocols_fields_place_items_as_observe_places_whole_events():
    """The protocol hands ``TranscriptOrder`` each event's fields as its
    handlers read them (``item_seen``, ``output_item_seen``,
    ``response_done``): the numbers and cuts are those of ``observe`` on the
    whole events, and a cut's line comes before the response's own line."""
    events = [
        user_item("u1", None), *reply("r1", "a1", "u1", "Let me look that up and then", cancelled=True),
        user_item("u2", "a1"), user_item("x", "u1"), user_text("u1", "Search for the offsite."),
        *reply("r2", "a2", "u2", "Sure.", cancelled=True, transcript_after_done=True),
    ]
    p = CallProtocol("rtc_order")
    p.handle(Connected(), 0.0)
    whole = TranscriptOrder()
    kinds = []
    for i, obj in enumerate(events):
        effects = p.handle(Received(ev(obj)), float(i))
        kinds += [e.kind for e in effects if isinstance(e, RecordLine)]
        whole.observe(ev(obj))
        if obj["type"].endswith((".completed", "transcript.done")):    # as the protocol places a transcript
            whole.place_transcript(obj["item_id"])
    for item_id in ("u1", "a1", "u2", "x", "a2"):
        assert p.spoken.order_of(item_id) == whole.order_of(item_id), item_id
    assert p.spoken.order_of("x") == 1.5
    assert kinds.index("transcript_cut") == kinds.index("response") - 1
