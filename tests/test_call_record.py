"""CallRecord on real files: written as the call goes, fsyncs grouped,
fresh-line appends after a torn line, nothing for a call that never
connected, and ``read_record`` that survives a torn line."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import time
from enum import StrEnum
from pathlib import Path

import trio

from voiceactors.call.record import (CallRecord, append_block, last_block, read_record, record_path,
                                            render_line)


async def _until(predicate) -> None:
    """Poll in small virtual steps (the writer works in a thread, which lets
    autojump_clock move on): at most 5 virtual seconds."""
    for _ in range(500):
        if predicate():
            return
        await trio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_lines_are_written_as_they_come_and_grouped_under_load(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        record = CallRecord("rtc_live", tmp_path)
        await nursery.start(record.run)
        record.opened()
        for i in range(200):                        # a burst: one flush, not 200 fsyncs
            record.add("tool_call", tool_call_id=f"call_{i}")
        await _until(lambda: record.path.exists() and len(read_record(record.path)) == 201)
        assert record.flushes <= 3
        lines = read_record(record.path)
        assert lines[0]["kind"] == "start" and [x["tool_call_id"] for x in lines[1:]] == [
            f"call_{i}" for i in range(200)]
        record.add("transcript", role="user", item_id="item_1", text="hello")   # batched: not at once
        t0 = trio.current_time()
        await trio.sleep(0.5)
        assert len(read_record(record.path)) == 201
        await _until(lambda: read_record(record.path)[-1]["kind"] == "transcript")
        assert trio.current_time() - t0 < 2.5      # BATCH_S, plus the virtual time the write thread took
        record.add("end", reason="closed_by_service")
        assert await record.close() is True
    assert read_record(record.path)[-1]["kind"] == "end"


async def test_a_call_that_never_connected_writes_nothing(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        record = CallRecord("rtc_bogus", tmp_path)
        await nursery.start(record.run)
        record.add("reconnect", attempt=1)
        record.add("end", reason="call_gone")
        assert await record.close() is False
    assert not record_path(tmp_path, "rtc_bogus").exists()


def test_a_torn_last_line_is_skipped_and_the_next_block_starts_on_a_fresh_line(tmp_path):
    path = record_path(tmp_path, "rtc_torn")
    append_block(path, [json.dumps({"kind": "start", "call_id": "rtc_torn"}), json.dumps({"kind": "connect"})])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "tool_started", "tool_call_id": "ca')            # killed mid-append
    assert [x["kind"] for x in read_record(path)] == ["start", "connect"]   # readable, torn line skipped
    append_block(path, [json.dumps({"kind": "start", "call_id": "rtc_torn", "rejoined": True})])
    lines = read_record(path)
    assert [x["kind"] for x in lines] == ["start", "connect", "start"]
    assert last_block(lines) == [{"kind": "start", "call_id": "rtc_torn", "rejoined": True}]
    assert path.read_text(encoding="utf-8").endswith('"ca\n{"kind": "start", "call_id": "rtc_torn", "rejoined": true}\n')


def test_read_record_splits_on_newlines_only(tmp_path):
    path = record_path(tmp_path, "rtc_sep")
    append_block(path, [json.dumps({"kind": "transcript", "text": "a\u2028b\u0085c"}, ensure_ascii=False)])
    assert read_record(path) == [{"kind": "transcript", "text": "a\u2028b\u0085c"}]


async def test_one_writer_groups_every_call_and_one_file_failing_stays_its_own(tmp_path):
    # real time: 51 appends in a worker thread outlast autojump's virtual polling
    from voiceactors.call.record import shared_writer

    async with trio.open_nursery() as nursery:
        records = [CallRecord(f"rtc_burst_{n}", tmp_path) for n in range(50)]
        broken = CallRecord("rtc_broken", tmp_path)
        broken.path.parent.mkdir(parents=True, exist_ok=True)
        broken.path.mkdir()                        # a directory where the file goes: its appends fail
        for record in (*records, broken):
            await nursery.start(record.run)
        writer = shared_writer()
        assert all(r._writer is writer for r in records)    # one writer for the whole run
        before = writer.passes
        for record in (*records, broken):          # 51 calls connect at once
            record.opened()
            record.add("tool_started", tool_call_id="call_1")
        await _until(lambda: all(r.flushes == 1 for r in records) and broken.failed is not None)
        assert writer.passes - before <= 2         # grouped: not one thread hop per call
        for record in records:
            assert [x["kind"] for x in read_record(record.path)] == ["start", "tool_started"]
        for record in records:
            record.add("end", reason="closed_by_service")
            assert await record.close() is True
        assert await broken.close() is True and broken.failed is not None   # told, never hung
    for record in records:
        assert [x["kind"] for x in read_record(record.path)] == ["start", "tool_started", "end"]


def _writer_tasks() -> int:
    """Live tasks named like the record writer, by a walk from the root task."""
    count, stack = 0, [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += task.name == "call-record-writer"
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


async def test_the_writer_retires_with_the_last_record_and_a_new_one_starts(tmp_path):
    from voiceactors.call.record import shared_writer

    first = CallRecord("rtc_first", tmp_path)
    writer = shared_writer()
    assert _writer_tasks() == 1
    first.opened()
    first.add("end", reason="closed_by_service")
    assert await first.close() is True
    await trio.sleep(0.05)
    assert _writer_tasks() == 0                 # no task outlives the calls (the soak counts them)
    second = CallRecord("rtc_second", tmp_path)
    assert second._writer is not writer and _writer_tasks() == 1
    second.opened()
    second.add("end", reason="closed_by_service")
    assert await second.close() is True
    assert [x["kind"] for x in read_record(second.path)] == ["start", "end"]


async def test_each_line_is_one_json_object_unescaped_one_per_line(tmp_path, autojump_clock):
    """The file holds each line as one compact JSON object (orjson renders
    them) ending in one newline, whose value is what ``json.dumps(line,
    ensure_ascii=False, default=str)`` gave before: text stays as spoken
    (no ``\\u`` escapes), a value JSON has no type for is its ``str``, a
    newline inside a text stays escaped."""
    record = CallRecord("rtc_text", tmp_path)
    record.opened()
    record.add("transcript", role="user", item_id="item_1", text="Grüße,\nça va? 日本")
    record.add("tool_call", tool_call_id="call_1", state=tmp_path / "x")     # not a JSON type: its str
    assert await record.close() is True
    raw = record.path.read_text(encoding="utf-8")
    assert raw.endswith("\n") and raw.count("\n") == 3
    assert [json.loads(line) for line in raw.splitlines()] == read_record(record.path)
    assert read_record(record.path)[1:] == [json.loads(json.dumps(line, ensure_ascii=False, default=str))
                                            for line in record.lines[1:]]
    assert 'Grüße,\\nça va? 日本' in raw and str(tmp_path / "x") in raw


class _Plain(StrEnum):
    A = "a"


@dataclasses.dataclass
class _Point:
    x: int


def test_a_line_renders_to_the_value_json_dumps_gave_whatever_its_values():
    """The fast renderer keeps the old encoder's values for every kind of
    value a line may hold: a str enum is its value; a dataclass, a datetime,
    a path, a set its ``str``; and what orjson refuses (an int past 64 bits,
    a key that is not a string, a lone surrogate from a service's ``\\ud800``)
    goes through the json encoder instead of failing the record."""
    line = {"kind": "tool_call", "t": 1e-05, "big": 10 ** 30, "keys": {1: "one"}, "enum": _Plain.A,
            "point": _Point(3), "at": datetime.datetime(2026, 12, 1, 21, 0, tzinfo=datetime.timezone.utc),
            "path": Path("/x/y"), "set": {1}, "tuple": (1, 2.5), "nested": [{"t": 1e16}], "none": None,
            "text": "a\u2028b\"c\\d\n日本"}
    for one in ({k: v for k, v in line.items() if k not in ("big", "keys")}, line,
                {"kind": "transcript", "text": json.loads('"\\ud800 half"')}):
        rendered = render_line(one)
        assert rendered.endswith(b"\n") and rendered.count(b"\n") == 1
        assert json.loads(rendered) == json.loads(json.dumps(one, ensure_ascii=True, default=str))
    assert render_line({"kind": "end", "text": "日本"}) == '{"kind":"end","text":"日本"}\n'.encode()   # compact, unescaped


async def test_a_line_with_a_lone_surrogate_is_written_and_the_record_goes_on(tmp_path, autojump_clock):
    """A transcript whose text holds a lone surrogate (JSON's ``\\ud800``
    decodes to one) used to fail its record's every pass: UTF-8 has no
    bytes for it, the lines stayed in memory and the end never reached the
    file. It is written escaped, and so is everything after it; it reads
    back as U+FFFD (``read_record``, docs/reliability.md § 14.1)."""
    record = CallRecord("rtc_surrogate", tmp_path)
    record.opened()
    record.add("transcript", role="user", item_id="item_1", text=json.loads('"bad \\udc80 half"'))
    record.add("tool_call", tool_call_id="call_1")
    record.add("end", reason="closed_by_service")
    assert await record.close() is True and record.failed is None
    lines = read_record(record.path)
    assert [x["kind"] for x in lines] == ["start", "transcript", "tool_call", "end"]
    assert lines[1]["text"] == "bad \ufffd half"
    assert "bad \\udc80 half" in record.path.read_text(encoding="utf-8")


async def test_a_line_s_own_kind_and_time_cannot_be_overridden_by_its_fields(tmp_path, autojump_clock):
    """``kind`` and ``t`` are the record's to set: fields naming them are a
    bug of the caller and refused, the line not added; a line that records
    a moment already past says so with ``t=`` (seconds since the start)."""
    record = CallRecord("rtc_fields", tmp_path)
    await trio.sleep(2.0)
    for fields in ({"kind": "end", "reason": "x"}, {"t": 0.5}):
        try:
            record.add_fields("tool_call", fields)
        except ValueError as refused:
            assert "tool_call" in str(refused) and next(iter(fields)) in str(refused)
        else:
            raise AssertionError(f"{fields} was accepted")
    try:
        record.add("transcript", t=0.5, text="hi")
    except ValueError:
        pass
    else:
        raise AssertionError("add() let t through")
    assert [line["kind"] for line in record.lines] == ["start"]
    record.add_fields("response_create", {"event_id": "evt_1"}, t=0.5)
    record.add("usage", response_id="resp_1")
    assert [(line["kind"], line["t"]) for line in record.lines[1:]] == [("response_create", 0.5), ("usage", 2.0)]


async def _until_real(predicate, real_s: float = 20.0) -> None:
    """Poll in small virtual steps, bounded in real time: autojump_clock
    runs on while a pass's thread works, so virtual time is no bound."""
    give_up = time.monotonic() + real_s
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError("condition not reached")
        await trio.sleep(0.01)


async def test_under_load_passes_are_loaded_pass_gap_apart_and_a_lone_call_keeps_the_short_gap(tmp_path, autojump_clock):
    """Twenty calls each writing an urgent line every 10 ms share passes at
    most one per ``LOADED_PASS_GAP_S`` (the old 10 ms gap made ~5x as many
    thread hops); a lone call's urgent lines still go at once after a quiet
    spell and at most ``PASS_GAP_S`` apart. Virtual time only stretches
    while a pass's thread works (autojump), which loosens these bounds,
    never tightens them."""
    from voiceactors.call.record import LOADED_PASS_GAP_S, PASS_GAP_S, RecordWriter

    writer = RecordWriter(fsync=lambda fd: None)
    records = [CallRecord(f"rtc_load_{i}", tmp_path, writer=writer) for i in range(20)]
    for record in records:
        record.opened()
    await _until_real(lambda: all(r._flushed == 1 for r in records))
    start, passes0 = trio.current_time(), writer.passes

    async def busy(record: CallRecord) -> None:
        for n in range(50):
            record.add("tool_started", tool_call_id=f"call_{n}")
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(busy, record)
    await _until_real(lambda: all(r._flushed == len(r.lines) for r in records))
    elapsed, passes = trio.current_time() - start, writer.passes - passes0
    assert passes <= elapsed / LOADED_PASS_GAP_S + 2, (passes, elapsed)
    assert all(len(read_record(r.path)) == 51 for r in records)
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True

    lone_writer = RecordWriter(fsync=lambda fd: None)
    lone = CallRecord("rtc_lone", tmp_path, writer=lone_writer)
    lone.opened()
    await _until_real(lambda: lone._flushed == 1)
    await trio.sleep(1.0)                                  # quiet: the next urgent line goes at once
    lone.add("tool_started", tool_call_id="call_1")
    assert lone._writer._waiting[lone] == -math.inf
    await _until_real(lambda: lone._flushed == 2)
    assert lone_writer.last_gap_s == PASS_GAP_S            # one record in the pass: the short gap
    lone.add("tool_call", tool_call_id="call_1")
    assert lone._writer._waiting[lone] <= trio.current_time() + PASS_GAP_S
    await _until_real(lambda: lone._flushed == 3)
    lone.add("end", reason="closed_by_service")
    assert await lone.close() is True
