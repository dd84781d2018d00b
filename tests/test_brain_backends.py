"""The brain backends: local (composed), claude (a real stand-in process),
openai (a real loopback HTTP stand-in), plus the prompt and its wrapper."""

from __future__ import annotations

import datetime as _dt
import json
import math
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from chat_support import chat_app, completion, in_turn, serve_chat
from voiceactors.brain.actor import BrainActor
from voiceactors.messages import AwaitReady, GetBrain, RefreshBrain, ask
from voiceactors.brain import BrainError, BrainTimeout, make_backend
from voiceactors.brain.claude import ClaudeBackend, ClaudeProcessError
from voiceactors.brain.snapshot import gather, render_text
from voiceactors.brain.local import LocalBackend, compose
from voiceactors.brain.openai_text import OpenAITextBackend
from voiceactors.brain.prompt import PROMPT_TEMPLATE, BrainOutputError, extract_instruction, render_prompt
from voiceactors.brain.session_file import load_session_id
from voiceactors.settings import Settings

# ask requires its deadline; these tests bound the wait themselves (autojump_clock
# or a cancel scope), and a finite ask deadline would race autojump during thread waits
UNBOUNDED = math.inf

FAKE_CLAUDE = Path(__file__).parent / "bin" / "fake-claude"
TODAY = _dt.date(2026, 5, 4)


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    elif isinstance(data, list):
        path.write_text("".join(json.dumps(row) + "\n" for row in data))
    else:
        path.write_text(json.dumps(data))


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A small journal with one of everything the snapshot reads, today = TODAY."""
    root = tmp_path / "journal"
    _write(root / "config" / "journal.json", {
        "identity": {"name": "Ada Lovelace", "preferred": "Ada", "aliases": ["AL"]},
        "agent": {"name": "nova"},
    })
    _write(root / "identity" / "self.md", "# self\n\n[placeholder]\n\nI am nova, Ada's\njournal companion.\n")
    _write(root / "entities" / "ada" / "entity.json", {"id": "ada", "name": "Ada Lovelace", "type": "Person",
                                                       "is_principal": True})
    _write(root / "entities" / "charles" / "entity.json", {"id": "charles", "name": "Charles Babbage",
                                                           "type": "Person"})
    _write(root / "facets" / "work" / "facet.json", {"title": "Work", "description": "engines"})
    _write(root / "facets" / "work" / "activities" / "20260504.jsonl", [
        {"id": "meeting_090000_300", "activity": "meeting", "segments": ["090000_300"], "title": "Engine review",
         "description": "Reviewed the difference engine", "created_at": 1777885200000,
         "participation": [{"name": "Charles Babbage", "role": "attendee", "entity_id": "charles"},
                           {"name": "Ada Lovelace", "role": "attendee", "entity_id": "ada"},
                           {"name": "Mary Somerville", "role": "mentioned"}],
         "commitments": [{"owner": "Ada Lovelace", "owner_entity_id": "ada", "action": "Send the notes on the engine",
                          "counterparty": "Charles Babbage", "counterparty_entity_id": "charles",
                          "when": "Friday", "context": "engine review"}]},
        {"id": "anticipated_call_140000_0504", "activity": "call", "source": "anticipated",
         "target_date": "2026-05-04", "start": "14:00:00", "end": "14:30:00", "title": "Call with Charles Babbage",
         "location": "the study", "cancelled": False, "hidden": False,
         "participation": [{"name": "Charles Babbage", "role": "attendee", "entity_id": "charles"}]},
    ])
    _write(root / "chronicle" / "20260504" / "default" / "090000_300" / "summary.md",
           "## Summary\n\nReviewed the **difference engine** with [Charles](sol://x).\n")
    _write(root / "chronicle" / "20260504" / "talents" / "morning_briefing.json", {
        "metadata": {}, "your_day": [{"start": "14:00", "end": "14:30", "text": "Call with Charles."}],
        "yesterday": [], "needs_attention": [{"text": "Reply to the Royal Society letter", "source_id": ""}],
        "forward_look": [], "reading": [],
    })
    return root


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch) -> Path:
    """A launcher for tests/bin/fake-claude on this interpreter (fast start,
    no PATH lookup); logs every run's argv to ``runs.jsonl``."""
    launcher = tmp_path / "bin" / "claude"
    launcher.parent.mkdir()
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_CLAUDE}" "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_CLAUDE_LOG", str(tmp_path / "runs.jsonl"))
    monkeypatch.delenv("FAKE_CLAUDE_MODE", raising=False)
    return launcher


def _runs(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _settings(journal: Path, **changes: Any) -> Settings:
    return Settings(journal=journal, state_dir=journal.parent / "state", **changes)


# --- prompt -----------------------------------------------------------------------

def test_prompt_interpolates_agent_name_only():
    text = render_prompt("nova")
    assert text.startswith("You are preparing the current voice-session instruction for nova. ")
    assert "treat nova as the canonical spoken name" in text and "Establish who nova is" in text
    assert "{agent_name}" not in text and "chronicle/<today>/talents/morning_briefing.json" in text
    assert text.endswith("<voice_instruction> ... </voice_instruction>")
    assert PROMPT_TEMPLATE.count("{agent_name}") == 3 and render_prompt("{x}").count("{x}") == 3


def test_extract_instruction():
    assert extract_instruction("ok <voice_instruction>\n Speak.\n</voice_instruction> bye") == "Speak."
    for bad in ("no wrapper", "<voice_instruction>  </voice_instruction>", "<voice_instruction> ... </voice_instruction>",
                "<voice_instruction>unterminated", ""):
        with pytest.raises(BrainOutputError):
            extract_instruction(bad)


# --- context + local ----------------------------------------------------------------

def test_snapshot_reads_every_section(journal):
    snap = gather(journal, TODAY)
    assert snap.agent_name == "nova" and snap.owner_name == "Ada" and "AL" in snap.owner_names
    assert snap.identity_notes == ("I am nova, Ada's journal companion.",)
    assert snap.segment_count == 1 and snap.segments[0].start == "09:00"
    assert snap.segments[0].summary == "Summary Reviewed the difference engine with Charles."
    assert snap.people == ("Charles Babbage", "Mary Somerville")   # principal left out; calendar weighs most
    assert [(c.owner, c.action, c.counterparty, c.when) for c in snap.commitments] == [
        ("Ada Lovelace", "Send the notes on the engine", "Charles Babbage", "Friday")]
    assert [(e.time, e.title, e.attendees, e.location) for e in snap.calendar] == [
        ("14:00", "Call with Charles Babbage", (), "the study")]
    assert snap.highlights == ("Reply to the Royal Society letter",)
    assert snap.unavailable == ()
    text = render_text(snap)
    assert "Today: Monday, May 4, 2026 (2026-05-04)" in text and "Calendar: 14:00 Call with Charles Babbage" in text


def test_local_instruction_follows_the_voice_rules(journal):
    text = compose(gather(journal, TODAY))
    assert text.startswith("You are nova, the voice of Ada's journal, talking out loud.")
    for expected in ("Today is Monday, May 4, 2026.", "two to four short sentences", "honestly and briefly",
                     "The people who matter right now are Charles Babbage and Mary Somerville.",
                     "you are to Send the notes on the engine for Charles Babbage, due Friday",
                     "at 14:00, Call with Charles Babbage, at the study",
                     "From this morning's briefing: Reply to the Royal Society letter."):
        assert expected in text
    assert not any(mark in text for mark in ("**", "#", "](", "sol://", "\n-", "\n*"))
    assert compose(gather(journal, TODAY)) == text            # deterministic


def test_local_instruction_is_honest_about_an_empty_journal(tmp_path):
    text = compose(gather(tmp_path / "empty", TODAY))
    assert text.startswith("You are sol, the voice of this journal")
    for expected in ("Nothing has been recorded in the journal yet today.", "There are no open commitments",
                     "Nothing is on today's calendar.", "There is no morning briefing for today."):
        assert expected in text


def test_local_on_the_fixture_journal(fixture_journal):
    text = compose(gather(fixture_journal, _dt.date(2026, 3, 27)))
    assert text.startswith("You are sol, the voice of Tester's journal")
    assert "Series A term sheet" in text


def test_make_backend():
    settings = _settings(Path("/nonexistent"))
    assert [make_backend(settings, n).name for n in ("local", "claude", "openai")] == ["local", "claude", "openai"]
    with pytest.raises(ValueError):
        make_backend(settings, "gpt")


# --- claude -----------------------------------------------------------------------

async def test_claude_run_argv_and_instruction(journal, fake_claude, tmp_path):
    backend = ClaudeBackend(_settings(journal, claude_command=str(fake_claude)))
    instruction, session = await backend.generate(gather(journal, TODAY), None)
    assert instruction == "You are nova. Speak briefly, in plain spoken English (model haiku)."
    assert session == "fake-session-1"
    (run,) = _runs(tmp_path)
    assert run["argv"] == ["-p", render_prompt("nova"), "--output-format", "json", "--model", "haiku"]
    assert Path(run["cwd"]).resolve() == journal.resolve()


@pytest.mark.parametrize("mode, error", [
    ("garbage", BrainError), ("crash", ClaudeProcessError), ("nowrap", BrainOutputError), ("is_error", BrainError),
])
async def test_claude_bad_answers_fail(journal, fake_claude, monkeypatch, mode, error):
    monkeypatch.setenv("FAKE_CLAUDE_MODE", mode)
    backend = ClaudeBackend(_settings(journal, claude_command=str(fake_claude)))
    with pytest.raises(error):
        await backend.generate(gather(journal, TODAY), None)


async def test_claude_missing_executable_fails(journal, tmp_path):
    backend = ClaudeBackend(_settings(journal, claude_command=str(tmp_path / "no-such-claude")))
    with pytest.raises(BrainError, match="could not start"):
        await backend.generate(gather(journal, TODAY), None)


async def test_claude_unknown_session_retries_fresh(journal, fake_claude, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "stale_resume")
    backend = ClaudeBackend(_settings(journal, claude_command=str(fake_claude)))
    _, session = await backend.generate(gather(journal, TODAY), "old-session")
    assert session == "fake-session-1"
    assert [r["argv"][-2:] for r in _runs(tmp_path)] == [["--resume", "old-session"], ["--model", "haiku"]]


async def test_claude_session_persisted_and_resumed_across_restarts(journal, fake_claude, tmp_path):
    settings = _settings(journal, claude_command=str(fake_claude))
    (journal / "config" / "journal.json").write_text(json.dumps(
        {"agent": {"name": "nova"}, "voice": {"brain": "claude", "brain_model": "sonnet"}}))
    async with trio.open_nursery() as nursery:
        actor = BrainActor(settings)                  # backend chosen by config: claude
        await nursery.start(actor.run)
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.instruction.startswith("You are nova.") and state.session_id == "fake-session-1"
        nursery.cancel_scope.cancel()
    assert load_session_id(journal) == "fake-session-1"

    async with trio.open_nursery() as nursery:
        actor = BrainActor(settings)
        await nursery.start(actor.run)
        assert isinstance(await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED), type(state))
        nursery.cancel_scope.cancel()
    first, second = _runs(tmp_path)
    assert "--resume" not in first["argv"] and first["argv"][-2:] == ["--model", "sonnet"]
    assert second["argv"][-2:] == ["--resume", "fake-session-1"]


async def test_claude_failure_keeps_instruction(journal, fake_claude, monkeypatch):
    async with trio.open_nursery() as nursery:
        actor = BrainActor(_settings(journal, claude_command=str(fake_claude)), ClaudeBackend(
            _settings(journal, claude_command=str(fake_claude))))
        await nursery.start(actor.run)
        good = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        monkeypatch.setenv("FAKE_CLAUDE_MODE", "garbage")
        assert isinstance(await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED), BrainError)
        assert (await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)).instruction == good.instruction
        nursery.cancel_scope.cancel()


async def test_claude_hang_times_out_and_is_killed(journal, fake_claude, monkeypatch, autojump_clock):
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "hang")
    settings = _settings(journal, claude_command=str(fake_claude), brain_timeout_s=30.0)
    async with trio.open_nursery() as nursery:
        actor = BrainActor(settings, ClaudeBackend(settings))
        await nursery.start(actor.run)
        result = await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED)
        assert isinstance(result, BrainTimeout)
        assert not (await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)).refreshing   # the process was reaped: the run ended
        nursery.cancel_scope.cancel()


# --- openai -----------------------------------------------------------------------

def _chat_app(answers: list[tuple[int, Any]], seen: list[dict[str, Any]]) -> Any:
    """The stand-in for ``POST /v1/chat/completions`` answering with the next (status, body)."""
    return chat_app(in_turn(answers), seen)


_serve = serve_chat
_completion = completion


async def test_openai_backend_over_loopback(journal):
    seen: list[dict[str, Any]] = []
    answers = [(200, _completion("<voice_instruction>You are nova, briefly.</voice_instruction>")),
               (200, _completion("I forgot the wrapper")),
               (500, {"error": {"message": "boom", "type": "server_error"}})]
    async with trio.open_nursery() as nursery:
        base_url = await _serve(nursery, _chat_app(answers, seen))
        settings = _settings(journal, openai_base_url=base_url, openai_api_key_env="sk-test-key-000")
        backend = OpenAITextBackend(settings)
        snapshot = gather(journal, TODAY)
        assert await backend.generate(snapshot, "kept") == ("You are nova, briefly.", "kept")
        with pytest.raises(BrainOutputError):
            await backend.generate(snapshot, None)
        with pytest.raises(BrainError, match="status 500"):
            await backend.generate(snapshot, None)
        nursery.cancel_scope.cancel()
    first = seen[0]
    assert first["auth"] == "Bearer sk-test-key-000"
    assert first["body"]["model"] == "gpt-5-mini"
    system, user = first["body"]["messages"]
    assert system == {"role": "system", "content": render_prompt("nova")}
    assert user["role"] == "user" and user["content"] == "Current journal context:\n" + render_text(snapshot)


def _brain_tokens(model: str, kind: str) -> float:
    from voiceactors import metrics
    return metrics.METRICS.tokens.labels(source="brain", model=model, kind=kind)._value.get()


def _brain_cost(model: str) -> float:
    from voiceactors import metrics
    return metrics.METRICS.cost.labels(source="brain", model=model)._value.get()


async def test_the_openai_runs_usage_is_counted_and_priced_from_the_table(journal, log_stream):
    answer = _completion("<voice_instruction>Hi.</voice_instruction>")
    answer["usage"] = {"prompt_tokens": 900, "completion_tokens": 120, "total_tokens": 1020,
                       "prompt_tokens_details": {"cached_tokens": 600}}
    before = {k: _brain_tokens("gpt-5-mini", k) for k in ("text_in", "cached_in", "text_out")}
    cost_before = _brain_cost("gpt-5-mini")
    async with trio.open_nursery() as nursery:
        base_url = await _serve(nursery, _chat_app([(200, answer)], []))
        settings = _settings(journal, openai_base_url=base_url, openai_api_key_env="sk-test-key-000",
                             prices=("gpt-5-mini=0.25/2/0/0/0.025",))
        await OpenAITextBackend(settings).generate(gather(journal, TODAY), None)
        nursery.cancel_scope.cancel()
    after = {k: _brain_tokens("gpt-5-mini", k) - before[k] for k in before}
    assert after == {"text_in": 300, "cached_in": 600, "text_out": 120}
    # 300*0.25 + 600*0.025 + 120*2 = 330 per million
    assert _brain_cost("gpt-5-mini") - cost_before == pytest.approx(0.00033)
    assert '"event": "brain.usage"' in log_stream.getvalue()


async def test_the_claude_runs_usage_and_reported_cost_are_counted(journal, fake_claude):
    before = {k: _brain_tokens("haiku", k) for k in ("text_in", "cached_in", "text_out")}
    cost_before = _brain_cost("haiku")
    await ClaudeBackend(_settings(journal, claude_command=str(fake_claude))).generate(gather(journal, TODAY), None)
    after = {k: _brain_tokens("haiku", k) - before[k] for k in before}
    assert after == {"text_in": 1500, "cached_in": 4000, "text_out": 250}
    assert _brain_cost("haiku") - cost_before == pytest.approx(0.0123)   # as the CLI reported it


async def test_openai_backend_uses_the_configured_model_through_the_actor(journal):
    seen: list[dict[str, Any]] = []
    answers = [(200, _completion("<voice_instruction>Hello from the model.</voice_instruction>"))]
    (journal / "config" / "journal.json").write_text(json.dumps({"agent": {"name": "nova"}, "voice": {
        "brain": "openai", "brain_model": "gpt-4.1-mini", "openai_api_key": "sk-journal-key-111"}}))
    async with trio.open_nursery() as nursery:
        base_url = await _serve(nursery, _chat_app(answers, seen))
        actor = BrainActor(_settings(journal, openai_base_url=base_url))
        await nursery.start(actor.run)
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.instruction == "Hello from the model." and state.session_id is None
        nursery.cancel_scope.cancel()
    assert seen[0]["body"]["model"] == "gpt-4.1-mini" and seen[0]["auth"] == "Bearer sk-journal-key-111"


async def test_openai_backend_without_key_fails(journal):
    backend = OpenAITextBackend(_settings(journal))
    with pytest.raises(BrainError, match="key not configured"):
        await backend.generate(gather(journal, TODAY), None)


async def test_local_backend_passes_session_through(journal):
    instruction, session = await LocalBackend().generate(gather(journal, TODAY), "s1")
    assert session == "s1" and instruction.startswith("You are nova")
