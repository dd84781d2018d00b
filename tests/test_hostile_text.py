"""Text no encoder can take (docs/reliability.md § 14.1): a lone surrogate
(``\\udc80``, what ``json.dumps`` writes for a surrogate-escaped byte) in
the journal or in the service's events comes in as U+FFFD, so nothing
downstream (the call record, the feed, SSE, the history, Redis) raises on it.

Real files, our simulator over real sockets, the HTTP app in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from calls_support import DAY
from clock_support import serving
from redis_support import redis_server  # noqa: F401  (the fixture)
from test_context_calls import SIM_KEY, app_for, sim  # noqa: F401  (the fixture)
from voiceactors.cluster.shared_feed import SharedFeed
from voiceactors.http import create_app
from voiceactors.http.app import voice_state
from voiceactors.journal import entities
from voiceactors.settings import Settings

#: The name as ``json.dumps`` writes it for the bytes ``Ba\x80d`` read with surrogateescape.
HOSTILE_NAME_JSON = '"Ba\\udc80d Actor"'
SAFE_NAME = "Ba\ufffdd Actor"


def plant_hostile_entity(journal: Path, slug: str = "bad_actor") -> str:
    folder = journal / "entities" / slug
    folder.mkdir(parents=True)
    (folder / "entity.json").write_text(
        '{"id": "%s", "name": %s, "type": "Person", "aka": ["\\udc80"]}\n' % (slug, HOSTILE_NAME_JSON),
        encoding="ascii")
    return slug


def select_and_get(slug: str) -> list[dict[str, Any]]:
    return [
        {"user_turn": {"text": "Let's talk about the bad actor."}},
        {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": slug},
                                      "call_id": "call_select"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Selected."}},
        {"user_turn": {"text": "Who is that?"}},
        {"response": {"tool_calls": [{"name": "entities.get", "arguments": {}, "call_id": "call_get"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "That is them."}},
        {"sleep": 0.5},
        {"close": 1000},
    ]


def test_the_journal_reader_pair_replaces_a_lone_surrogate(make_sample):
    journal = make_sample(days=2)
    slug = plant_hostile_entity(journal)
    entity = entities.load_entity(journal, slug)
    assert entity is not None and entity.name == SAFE_NAME
    assert SAFE_NAME.encode("utf-8")          # every encoder takes it


async def test_an_entity_named_with_a_lone_surrogate_selected_in_a_call(make_sample, tmp_path, sim, pin_today):
    """The reproduction: ``journal.select`` on the entity, then ``entities.get``;
    the call goes on to the service's close and its history answers 200."""
    pin_today(DAY.isoformat())
    journal = make_sample(days=2)
    slug = plant_hostile_entity(journal)
    app = app_for(journal, tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        call = sim.add_call("rtc_hostile_entity", select_and_get(slug))
        response = await client.post("/api/voice/connect", json={"call_id": "rtc_hostile_entity"})
        assert response.status_code == 200
        with trio.fail_after(20):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        assert json.loads(call.outputs["call_select"][0])["selected"]["name"] == SAFE_NAME
        assert json.loads(call.outputs["call_get"][0])["name"] == SAFE_NAME
        assert call.response_creates == 2 and call.violations == []
        detail = await wait_for_end(client, "rtc_hostile_entity")
        [end] = [line for line in detail["lines"] if line.get("kind") == "end"]
        assert end["reason"] == "closed_by_service"
        status = await client.get("/api/voice/status")
        assert status.status_code == 200


async def test_a_transcript_from_the_service_with_a_lone_surrogate(make_sample, tmp_path, sim, pin_today):
    """The service's text: a transcription whose transcript holds the escape
    of a lone surrogate (injected raw). The call goes on, the feed's
    ``transcript`` event and the history carry U+FFFD."""
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=2), tmp_path, sim)
    call_id = "rtc_hostile_transcript"
    frame = json.dumps({"type": "conversation.item.input_audio_transcription.completed", "event_id": "event_x",
                        "item_id": "item_hostile", "content_index": 0, "transcript": "caf\udc80 ok",
                        "usage": {"type": "duration", "seconds": 1.0}})
    assert "\\udc80" in frame
    async with serving(app) as test_app:
        client = test_app.test_client()
        call = sim.add_call(call_id, [{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi."}},
                                      {"sleep": 2.0}, {"user_turn": {"text": "Still there?"}},
                                      {"response": {"text": "Yes."}}, {"sleep": 0.5}, {"close": 1000}])
        response = await client.post("/api/voice/connect", json={"call_id": call_id})
        assert response.status_code == 200
        runtime = voice_state(app).runtime
        assert runtime is not None
        feed = runtime.actors["calls"].hub.live(call_id)   # what the SSE route subscribes to
        assert feed is not None
        sub = feed.subscribe()
        with trio.fail_after(10):
            await call.wait_until(lambda c: c.connection is not None and len(c.responses) >= 1)
        await sim.inject(call_id, frame)
        with trio.fail_after(20):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        assert call.violations == [] and len(call.responses) == 2
        events = []
        while True:
            try:
                events.append(sub.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        texts = [e.get("text") for e in events if e.get("type") == "transcript"]
        assert "caf\ufffd ok" in texts, texts
        for event in events:
            json.dumps(event, ensure_ascii=False).encode("utf-8")      # what the SSE writer does
        detail = await wait_for_end(client, call_id)
        [end] = [line for line in detail["lines"] if line.get("kind") == "end"]
        assert end["reason"] == "closed_by_service"
        assert any(line.get("text") == "caf\ufffd ok" for line in detail["lines"] if line.get("kind") == "transcript")


async def wait_for_end(client: Any, call_id: str) -> dict[str, Any]:
    """The call's history once it has its ``end`` line (each answer 200)."""
    with trio.fail_after(10):
        while True:
            response = await client.get(f"/api/voice/calls/{call_id}")
            assert response.status_code == 200, await response.get_data()
            detail: dict[str, Any] = await response.get_json()
            if any(line.get("kind") == "end" for line in detail["lines"]):
                return detail
            await trio.sleep(0.05)


async def test_under_redis_the_shared_feed_takes_the_entity_and_later_connects_work(
        make_sample, tmp_path, sim, pin_today, redis_server):  # noqa: F811
    """``--redis``: the selection event (the entity's name) goes through the
    shared feed's batch to a real redis-server. The batch is written, the
    runtime lives on: a later connect is answered 200 and its call served,
    ``/status`` is 200, and a reader on another process gets U+FFFD."""
    pin_today(DAY.isoformat())
    journal = make_sample(days=2)
    slug = plant_hostile_entity(journal)
    app = app_for(journal, tmp_path, sim, redis_url=redis_server.url)
    async with serving(app) as test_app:
        client = test_app.test_client()
        call = sim.add_call("rtc_hostile_shared", select_and_get(slug))
        assert (await client.post("/api/voice/connect", json={"call_id": "rtc_hostile_shared"})).status_code == 200
        with trio.fail_after(20):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        end = [line for line in (await wait_for_end(client, "rtc_hostile_shared"))["lines"] if line["kind"] == "end"]
        assert end[0]["reason"] == "closed_by_service"
        reader = SharedFeed(redis_server.url, max_len=100, retention_s=30.0, max_items=8, max_duration_s=3600.0,
                            max_per_call=2, max_total=3)
        async with trio.open_nursery() as nursery:     # another process's reader
            await nursery.start(reader.run)
            with trio.fail_after(10):
                while not (selections := [e for e in await reader.read("rtc_hostile_shared", "0-0", 0.5)
                                          if e["type"] == "selection"]):
                    pass
            nursery.cancel_scope.cancel()
        assert selections[0]["selection"]["name"] == SAFE_NAME
        # the runtime lives: a later call connects and is served
        later = sim.add_call("rtc_after_hostile", [{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi."}},
                                                    {"sleep": 0.3}, {"close": 1000}])
        response = await client.post("/api/voice/connect", json={"call_id": "rtc_after_hostile"})
        assert response.status_code == 200, await response.get_data()
        with trio.fail_after(20):
            await later.wait_until(lambda c: c.closed and c.connection is None)
        assert len(later.responses) == 1
        assert voice_state(app).runtime is not None
        assert (await client.get("/api/voice/status")).status_code == 200


# --- beyond the sideband and the entity: names, the search index, a rewritten journal row ------------

def test_a_journal_file_name_that_is_not_utf8_is_indexed_and_found(make_sample, tmp_path):
    """A day's talent file named with an undecodable byte (``os.listdir``
    gives a surrogate for it): the index build used to fail on it at
    SQLite's encoder, every time (no search at all); now the file is
    indexed under its name with U+FFFD and its text is found."""
    import os

    from voiceactors.journal import search

    journal = make_sample(days=2)
    day = sorted(p for p in (journal / "chronicle").iterdir() if p.is_dir())[0]
    (day / "talents").mkdir(exist_ok=True)
    (day / "talents" / os.fsdecode(b"caf\x80_summary.md")).write_text("the quetzalcoatl meeting went well\n")
    search.build_index(journal, tmp_path / "state")
    [hit] = search.search(journal, tmp_path / "state", "quetzalcoatl")
    assert hit.path == f"{day.name}/talents/caf\ufffd_summary.md"
    json.dumps(hit.__dict__, ensure_ascii=False).encode("utf-8")


def test_a_journal_row_with_a_lone_surrogate_escape_can_be_rewritten_and_keeps_it(make_sample):
    """``commitments.close`` appends an edit to the row that opened the item;
    a row carrying ``\\udc80`` (in a field of its own) was written back with
    the raw surrogate, which the file write refused (``tool failed`` for
    that item, forever). The row is written back with the escape kept."""
    from voiceactors.journal import ledger

    journal = make_sample(days=3)
    item = ledger.list_items(journal, state="open", top=1)[0]
    opening = ledger._derived(journal).opening[item.id]   # noqa: SLF001 - where the item lives
    path = journal / "facets" / opening.facet / "activities" / f"{opening.day}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("".join(json.dumps({**row, "x_note": "caf\udc80"}) + "\n" for row in rows), encoding="ascii")
    [same] = [i for i in ledger.list_items(journal, state="open", top=100) if i.id == item.id]
    closed = ledger.close(journal, same.id, "closed", "done")
    assert closed.state == "closed"
    text = path.read_text(encoding="utf-8")          # still UTF-8 throughout
    assert text.count('"x_note": "caf\\udc80"') == len(rows)


def test_an_identity_file_name_that_is_not_utf8_reaches_the_prompt_as_text(make_sample):
    import os

    from voiceactors.journal import config as journal_config

    journal = make_sample(days=2)
    (journal / "identity").mkdir(exist_ok=True)
    (journal / "identity" / os.fsdecode(b"s\x80lf.md")).write_text("me")
    files = journal_config.identity_files(journal)
    assert files["s\ufffdlf"] == "me"
    json.dumps(files, ensure_ascii=False).encode("utf-8")


async def test_a_brain_backend_answering_with_a_lone_surrogate(tmp_path, sim, monkeypatch):
    """The brain's answer comes in once for every backend (``BrainActor``):
    the Claude CLI stand-in (a real process) prints an instruction carrying
    ``\\udc80``; the mint sends it to the service (an HTTP JSON body) and
    answers 200."""
    from test_reliability_faults import claude_settings

    from voiceactors.journal.sample import write_sample_journal

    journal = write_sample_journal(tmp_path / "journal", days=2, today=DAY)
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "lone_surrogate")
    app = create_app(claude_settings(journal, tmp_path, sim).replace(openai_api_key_env=SIM_KEY))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/refresh-brain")
        assert response.status_code == 200
        assert "Caf\ufffd is open." in (await response.get_json())["instruction_preview"]
        response = await client.post("/api/voice/session")
        assert response.status_code == 200, await response.get_data()
        assert "Caf\ufffd is open." in sim.client_secret_requests[-1]["body"]["session"]["instructions"]


async def test_a_record_written_with_a_lone_surrogate_escape_is_shown(make_sample, tmp_path, sim):
    """A record from before the boundary: ``render_line``'s fallback wrote
    the surrogate as ``\\udc80``. ``read_record`` reads it as U+FFFD, so the
    history and its timeline picture (a UTF-8 body) answer 200."""
    from voiceactors.call.record import append_block, record_path, render_line

    app = app_for(make_sample(days=2), tmp_path, sim)
    path = record_path(tmp_path / "state", "rtc_old_record")
    path.parent.mkdir(parents=True)
    lines = [{"kind": "start", "t": 0.0, "call_id": "rtc_old_record", "at": "2026-03-27T10:00:00+00:00"},
             {"kind": "transcript", "t": 1.0, "role": "user", "item_id": "item_1", "text": "caf\udc80"},
             {"kind": "end", "t": 2.0, "reason": "closed_by_service", "duration_s": 2.0}]
    append_block(path, [render_line(line).decode("utf-8").rstrip("\n") for line in lines])
    assert "\\udc80" in path.read_text(encoding="utf-8")
    async with serving(app) as test_app:
        client = test_app.test_client()
        detail = await client.get("/api/voice/calls/rtc_old_record")
        assert detail.status_code == 200
        assert [e["text"] for e in (await detail.get_json())["transcript"]] == ["caf\ufffd"]
        picture = await client.get("/api/voice/calls/rtc_old_record/timeline.svg")
        assert picture.status_code == 200, await picture.get_data()


async def test_a_minted_secret_carrying_a_lone_surrogate_is_refused_cleanly(make_sample, tmp_path, sim):
    """The service's answer to a mint is a credential, never text to
    repair: one whose value is not ASCII (here ``\\udc80``) is the mint's
    documented failure, 500 ``voice session unavailable`` (it was an
    unhandled 500 from the JSON encoder); the next mint works."""
    app = app_for(make_sample(days=2), tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        sim.fail_next_mint("lone_surrogate")
        response = await client.post("/api/voice/session")
        assert response.status_code == 500
        assert await response.get_json() == {"error": "voice session unavailable"}
        response = await client.post("/api/voice/session")
        assert response.status_code == 200
        assert (await response.get_json())["ephemeral_key"] == sim.minted[-1]


async def test_a_client_body_with_a_lone_surrogate_gets_the_documented_answers(make_sample, tmp_path, sim):
    """A client's JSON comes in once (``routes._json_object``): a sign-in
    token carrying ``\\udc80`` is a wrong token (401; the comparison's
    encoder raised: 500), and a linked context naming one is 400."""
    app = create_app(Settings(journal=make_sample(days=2), state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                              openai_base_url=sim.base_url, rate_limit_per_s=0, api_token="tok-hostile-123456"))
    hostile = b'{"token": "tok-hostile-\\udc80"}'
    async with serving(app) as test_app:
        client = test_app.test_client()
        headers = {"Content-Type": "application/json"}
        response = await client.post("/api/voice/login", data=hostile, headers=headers)
        assert response.status_code == 401
        assert await response.get_json() == {"error": "unauthorized"}
        auth = {**headers, "Authorization": "Bearer tok-hostile-123456"}
        response = await client.post("/api/voice/connect", headers=auth,
                                     data=b'{"call_id": "rtc_x", "context": {"kind": "entity", "id": "caf\\udc80"}}')
        assert response.status_code == 400
        assert await response.get_json() == {"error": "context.id is invalid"}


async def test_the_mcp_server_answers_about_the_entity(make_sample, tmp_path, pin_today):
    """``/mcp``: ``entities.get`` on the entity named with ``\\udc80``
    answers its name with U+FFFD; a JSON-RPC request carrying the escape
    itself is refused by the SDK's parser, in the JSON-RPC shape."""
    import httpx

    from mcp_server_support import POST_HEADERS, rpc, served

    pin_today(DAY.isoformat())
    journal = make_sample(days=2)
    slug = plant_hostile_entity(journal)
    settings = Settings(journal=journal, state_dir=tmp_path / "state").replace(rate_limit_per_s=0,
                                                                             mcp_rate_limit_per_s=0)
    async with served(settings) as base, httpx.AsyncClient(base_url=base) as http:
        answer = await http.post("/mcp", json=rpc("tools/call", {"name": "entities.get",
                                                                 "arguments": {"entity_slug": slug}}),
                                 headers=POST_HEADERS)
        refused = await http.post("/mcp", headers=POST_HEADERS, content=(
            b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "journal.search",'
            b' "arguments": {"query": "caf\\udc80"}}}'))
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["structuredContent"]["name"] == SAFE_NAME
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32700


async def test_a_captured_event_with_a_lone_surrogate_keeps_its_escape(tmp_path, autojump_clock):
    """``record_events``: the capture decodes each event itself and wrote it
    with ``ensure_ascii=False``, so a transcript carrying ``\\udc80`` failed
    the capture's write (a ``UnicodeEncodeError`` in its worker thread, out
    of the capture task). The capture keeps the escape, as received."""
    from calls_support import rig
    from voiceactors.call.event_capture import capture_path, read_capture

    frame = json.dumps({"type": "conversation.item.input_audio_transcription.completed", "event_id": "event_x",
                        "item_id": "item_hostile", "content_index": 0, "transcript": "caf\udc80",
                        "usage": {"type": "duration", "seconds": 1.0}})
    async with rig(tmp_path, record_events=True) as r:
        r.sim.add_call("rtc_capture_hostile", [{"sleep": 0.5}, {"close": 1000}])
        sim_call = r.sim.calls["rtc_capture_hostile"]

        async def inject() -> None:
            await sim_call.wait_until(lambda c: c.connection is not None)
            await r.sim.inject("rtc_capture_hostile", frame)

        r.nursery.start_soon(inject)
        actor, _ = await r.run_call("rtc_capture_hostile")
    assert actor.end_reason == "closed_by_service"
    path = capture_path(r.settings.state_dir, "rtc_capture_hostile")
    assert '"transcript": "caf\\udc80"' in path.read_text(encoding="utf-8")
    (block,) = read_capture(path)
    assert block[-1]["kind"] == "end"
    [event] = [line["event"] for line in block if line["kind"] == "event"
               and line["event"]["type"] == "conversation.item.input_audio_transcription.completed"]
    assert event["transcript"] == "caf\udc80"          # read back as captured
