"""Call history: summaries and lines of the call records, for the console.

Records are read only through ``call.record.parse_record`` (the file read
bounded, regular files only). A record may lack
its ``end`` line (the call is still live, or the server died mid-call) and
may hold line kinds this module does not know: both are shown for what they
are, never an error. Listing is bounded (``MAX_LIST``) and newest first by
file modification time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from voiceactors import storage
from voiceactors.call.continuation import continuable
from voiceactors.call.record import parse_record, record_path
from voiceactors.call.state import ToolOutcome
from voiceactors.call.handoff import in_charge_after
from voiceactors.call.record_kind import RecordKind
from voiceactors.usage.cost import Tokens, round_usd

DEFAULT_LIST = 50
MAX_LIST = 200
FIRST_WORDS_CHARS = 80        # the call list's "what was said": about one line
MAX_RECORD_BYTES = 4 * 1024 * 1024    # a record larger than this is not loaded into a page
#: How much of a record's head is read to learn which call it continues (its
#: ``start`` and ``context`` lines: the brain's instruction and the account)
HEAD_BYTES = 256 * 1024
#: The outcomes a call summary does not count as a tool failure (``pending``: the
#: call has only its ``tool_started`` line: still running, or the server died).
#: A tuple, not a set: an outcome read from a file may be any JSON value, hashable or not.
NOT_FAILED = (ToolOutcome.OK, ToolOutcome.REPLAYED, ToolOutcome.PENDING)


class RecordUnreadable(Exception):
    """A record file exists but is not JSON lines (or is too large)."""


@dataclass(frozen=True)
class RecordFile:
    call_id: str
    paths: tuple[Path, ...]     # the call's record in each state folder that has one, oldest first
    mtime: float                # the newest of them


WORKERS_FOLDER = "workers"      # ``serve --workers N``: <state_dir>/workers/<i>/ is worker i's state folder


def history_root(settings: Any) -> Path:
    """The state folder whose calls the history shows: a ``serve --workers``
    worker's is its parent's (``<root>/workers/<i>`` → ``<root>``), so every
    worker's console shows every worker's calls."""
    state_dir = Path(settings.state_dir)
    if getattr(settings, "worker_index", None) is not None and state_dir.parent.name == WORKERS_FOLDER:
        return state_dir.parent.parent
    return state_dir


def state_folders(state_dir: Path) -> list[Path]:
    """``state_dir`` and its workers' state folders (``workers/<i>/``), if any."""
    root = Path(state_dir)
    try:
        workers = sorted(p for p in (root / WORKERS_FOLDER).iterdir() if p.is_dir())
    except OSError:
        workers = []
    return [root, *workers]


def list_record_files(state_dir: Path, limit: int = DEFAULT_LIST) -> list[RecordFile]:
    """The newest ``limit`` calls' record files under ``<state_dir>/calls``
    and each worker's ``<state_dir>/workers/<i>/calls``. A call taken over by
    another worker has a record in both folders: one entry, its files in the
    order they were last written (the dead holder's first)."""
    by_call: dict[str, list[tuple[float, Path]]] = {}
    for folder in state_folders(state_dir):
        try:
            entries = list((folder / "calls").glob("*.jsonl"))
        except OSError:
            continue
        for path in entries:
            try:
                by_call.setdefault(path.stem, []).append((path.stat().st_mtime, path))
            except OSError:
                continue        # removed between the listing and the stat
    found = [RecordFile(call_id, tuple(p for _, p in sorted(files)), max(m for m, _ in files))
             for call_id, files in by_call.items()]
    found.sort(key=lambda f: (f.mtime, f.call_id), reverse=True)
    return found[: max(0, limit)]


def load_lines(path: Path) -> list[dict[str, Any]]:
    """A record's lines (objects only). Raises ``RecordUnreadable`` (also
    for a file that is not a regular one: a FIFO in ``calls/`` held a worker
    thread, and the request, for good); ``FileNotFoundError`` when there is
    no record. At most ``MAX_RECORD_BYTES`` are read."""
    try:
        with storage.open_regular(path) as handle:
            data = handle.read(MAX_RECORD_BYTES + 1)
    except ValueError:
        raise RecordUnreadable("not a regular file") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordUnreadable("record too large")
    try:
        lines = [line for line in parse_record(data.decode("utf-8", "replace")) if isinstance(line, dict)]
    except (ValueError, RecursionError) as error:
        raise RecordUnreadable(type(error).__name__) from None
    if not lines and data:
        raise RecordUnreadable("no record line")    # a reader that skips torn lines found nothing whole
    return lines


def load_call_lines(paths: tuple[Path, ...]) -> list[dict[str, Any]]:
    """The lines of one call's records, file after file (each holds whole runs)."""
    return [line for path in paths for line in load_lines(path)]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarize(call_id: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One call's summary. A file holds one block per actor run (each from
    ``start`` to ``end``, or cut short by a crash); the summary covers them
    all: first start, every run's time summed, the last run's end reason
    (None while the last run has no ``end``: live, or the server died)."""
    starts = [line for line in lines if line.get("kind") == RecordKind.START]
    tool_calls = settled_and_pending_tool_calls(lines)
    responses = [line for line in lines if line.get("kind") == RecordKind.RESPONSE]
    started_at = next((s.get("at") for s in starts if isinstance(s.get("at"), str)), None)
    runs = [_run_time(run) for run in _runs(lines)]
    duration_s = sum(t for t, _ in runs) if runs else None
    last_end = runs[-1][1] if runs else None
    summary = {
        "call_id": call_id,
        "started_at": started_at,
        "duration_s": round(duration_s, 3) if duration_s is not None else None,
        "ended": last_end.get("reason") if last_end is not None else None,
        "tool_calls": len(tool_calls),
        "tool_failures": sum(1 for c in tool_calls if c.get("outcome") not in NOT_FAILED),
        "responses": len(responses),
        "barge_ins": sum(1 for r in responses if r.get("status") == "cancelled"),
        "reconnects": sum(1 for line in lines if line.get("kind") == RecordKind.RECONNECT),
        "runs": max(1, len(starts)),
        "first_words": first_words(lines),
        **usage_summary(lines),
        **continues_field(lines),
    }
    agent = agent_in_charge(lines)
    if agent is not None:      # only a call with agents has it (docs/agents.md)
        summary["agent"] = agent
    phone = next((s for s in starts if s.get("arrival") == "phone"), None)
    if phone is not None:      # only a phone call's summary has it: a browser call's is as it was
        summary["phone"] = {"caller": phone.get("caller") if isinstance(phone.get("caller"), str) else None}
    if any(s.get("arrival") == "live" for s in starts):
        summary["live"] = True     # a Live call's (docs/live.md); absent from every other summary
    return summary


def agents_by_line(lines: list[dict[str, Any]]) -> list[str | None]:
    """The agent in charge at each line (``handoff.in_charge_after``; None
    before a run names one: a call without agents)."""
    agent: str | None = None
    found = []
    for line in lines:
        if line.get("kind") == RecordKind.START:
            agent = None
        agent = in_charge_after(line, agent)
        found.append(agent)
    return found


def agent_in_charge(lines: list[dict[str, Any]]) -> str | None:
    """The agent in charge at the record's last line (None: a call without agents)."""
    return next((agent for agent in reversed(agents_by_line(lines)) if agent is not None), None)


def continued_call(lines: list[dict[str, Any]]) -> str | None:
    """The id of the call these lines' call continues (its first ``context``
    line's ``continuation``), or None."""
    for line in lines:
        if line.get("kind") == RecordKind.CONTEXT:
            context = line.get("context")
            found = context.get("continuation") if isinstance(context, dict) else None
            call_id = found.get("call_id") if isinstance(found, dict) else None
            return call_id if isinstance(call_id, str) else None
    return None


def continues_field(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary's ``continues`` (only for a call that continues another)."""
    call_id = continued_call(lines)
    return {} if call_id is None else {"continues": call_id}


def _head_lines(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a record's first ``HEAD_BYTES`` (unreadable: none)."""
    try:
        with storage.open_regular(path) as handle:
            data = handle.read(HEAD_BYTES)
    except (OSError, ValueError):
        return []
    if len(data) == HEAD_BYTES:
        data = data[: data.rfind(b"\n") + 1]
    return [line for line in parse_record(data.decode("utf-8", "replace")) if isinstance(line, dict)]


def continued_by(state_dir: Path, call_id: str, since: float) -> list[str]:
    """The calls, newest first, that continue ``call_id``: among the newest
    ``MAX_LIST`` records written since ``since`` (the earlier call's record's
    last change: a continuation starts after it ended), those whose first
    ``context`` line names it."""
    return [record.call_id for record in list_record_files(state_dir, MAX_LIST)
            if record.mtime >= since and record.call_id != call_id
            and continued_call([line for path in record.paths for line in _head_lines(path)]) == call_id]


def first_words(lines: list[dict[str, Any]]) -> str | None:
    """What the call was about, for a list a person scans: the first thing
    the person said (else the assistant's first words), cut at a word
    boundary near ``FIRST_WORDS_CHARS``; None when nothing was transcribed."""
    spoken = [entry for entry in spoken_transcript(lines) if entry["text"].strip()]
    first = next((e for e in spoken if e["role"] == "user"), spoken[0] if spoken else None)
    if first is None:
        return None
    text = " ".join(first["text"].split())
    if len(text) <= FIRST_WORDS_CHARS:
        return text
    cut = text[:FIRST_WORDS_CHARS].rsplit(" ", 1)[0] or text[:FIRST_WORDS_CHARS]
    return cut.rstrip(",.;:") + "…"


def usage_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A call's tokens and cost from its ``usage`` lines (every run's):
    ``model`` (the last one named), ``tokens`` by kind, ``total_tokens``,
    ``cost_usd`` (None when some response's model had no prices). A Live
    call's ``audio_usage`` lines add their seconds (``audio_s``, only in a
    summary that has some) and their cost (None when the Live model had no
    per-minute price)."""
    usage = [line for line in lines if line.get("kind") == RecordKind.USAGE]
    audio = [line for line in lines if line.get("kind") == RecordKind.AUDIO_USAGE]
    tokens = Tokens()
    cost: float | None = 0.0
    for line in usage:
        tokens.add(Tokens.from_dict(line.get("tokens")))
        line_cost = _number(line.get("cost_usd"))
        cost = None if cost is None or line_cost is None else cost + line_cost
    audio_s = 0.0
    for line in audio:
        audio_s += _number(line.get("added_s")) or 0.0
        line_cost = _number(line.get("cost_usd"))
        cost = None if cost is None or line_cost is None else cost + line_cost
    model = next((line.get("model") for line in reversed(usage) if isinstance(line.get("model"), str)), None)
    summary = {"model": model, "tokens": tokens.as_dict(), "total_tokens": tokens.total, "cost_usd": round_usd(cost)}
    if audio:
        summary["audio_s"] = audio_s
    return summary


def settled_and_pending_tool_calls(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per tool call: its ``tool_call`` line (settled), or for a call
    whose record has only its ``tool_started`` (still running, or the server
    died), that line with outcome ``pending``."""
    settled = {line.get("tool_call_id"): line for line in lines if line.get("kind") == RecordKind.TOOL_CALL}
    out = [line for line in lines if line.get("kind") == RecordKind.TOOL_CALL]
    for line in lines:
        if line.get("kind") == RecordKind.TOOL_STARTED and line.get("tool_call_id") not in settled:
            settled[line.get("tool_call_id")] = line
            out.append({**line, "kind": RecordKind.TOOL_CALL, "outcome": ToolOutcome.PENDING, "duration_ms": None})
    return out


def _runs(lines: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The lines split at each ``start`` (lines before the first one, a
    record cut at its head, count with the first run)."""
    runs: list[list[dict[str, Any]]] = []
    for line in lines:
        if line.get("kind") == RecordKind.START or not runs:
            runs.append([])
        runs[-1].append(line)
    return runs


def _run_time(run: list[dict[str, Any]]) -> tuple[float, dict[str, Any] | None]:
    """A run's duration and its ``end`` line: the end's ``duration_s``, or,
    for a run with no end (live, or cut by a crash), its last line's time."""
    end = next((line for line in reversed(run) if line.get("kind") == RecordKind.END), None)
    if end is not None and (duration := _number(end.get("duration_s"))) is not None:
        return duration, end
    return max((_number(line.get("t")) or 0.0 for line in run), default=0.0), end


Summarize = Callable[[str, list[dict[str, Any]]], dict[str, Any]]


def list_calls(state_dir: Path, limit: int = DEFAULT_LIST, summary: Summarize = summarize) -> list[dict[str, Any]]:
    """Summaries of the newest calls (``summary``: of one call's lines; the
    API's by default); an unreadable record is listed as such."""
    out = []
    for record in list_record_files(state_dir, limit):
        try:
            out.append(summary(record.call_id, load_call_lines(record.paths)))
        except (OSError, RecordUnreadable):
            out.append({**summary(record.call_id, []), "ended": None, "duration_s": None,
                        "unreadable": True})
    return out


def call_lines(state_dir: Path, call_id: str) -> list[dict[str, Any]]:
    """One call's record lines over every state folder that has its record.
    Raises ``FileNotFoundError`` or ``RecordUnreadable``."""
    found = [record_path(folder, call_id) for folder in state_folders(state_dir)]
    paths = sorted((p for p in found if p.exists()), key=lambda p: p.stat().st_mtime)
    if not paths:
        raise FileNotFoundError(found[0])
    return load_call_lines(tuple(paths))


def call_detail(state_dir: Path, call_id: str) -> dict[str, Any]:
    """``{"call": summary, "lines": [...], "transcript": [...], "usage": [...], "hosted_tools": [...]}``
    for one call (``usage``: one entry per response, from the ``usage`` lines;
    ``hosted_tools``: the calls of OpenAI-hosted MCP tools the service ran);
    for a call that ended at its time limit also ``continued_by``: the calls
    that continue it, newest first.
    Raises ``FileNotFoundError`` or ``RecordUnreadable``."""
    lines = call_lines(state_dir, call_id)
    summary = summarize(call_id, lines)
    usage = [{"response_id": line.get("response_id"), "tokens": Tokens.from_dict(line.get("tokens")).as_dict(),
              "cost_usd": _number(line.get("cost_usd")), "t": line.get("t")}
             for line in lines if line.get("kind") == RecordKind.USAGE]
    detail: dict[str, Any] = {"call": summary, "lines": lines, "transcript": spoken_transcript(lines),
              "usage": usage, "hosted_tools": hosted_tool_calls(lines)}
    if continuable(summary["ended"]):
        detail["continued_by"] = continued_by(state_dir, call_id, _newest_change(state_dir, call_id))
    return detail


def _newest_change(state_dir: Path, call_id: str) -> float:
    """When the call's record last changed (its newest file's mtime; 0 when unknown)."""
    times = []
    for folder in state_folders(state_dir):
        try:
            times.append(record_path(folder, call_id).stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def hosted_tool_calls(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's calls of OpenAI-hosted MCP tools (``hosted_tool`` lines),
    in the order they ended: the service ran them, so they are not among the
    call's tool calls (``summarize``), only listed."""
    return [{"server": line.get("server"), "tool": line.get("tool"), "status": line.get("status"),
             "error": line.get("error"), "item_id": line.get("item_id"), "t": line.get("t")}
            for line in lines if line.get("kind") == RecordKind.HOSTED_TOOL]


def spoken_transcript(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's transcripts in spoken order: run by run (blocks), and
    within a run by each line's ``order`` (the conversation's item order,
    ``call/transcript_order.py``); lines without one (older records) keep
    their place in the file. ``cut_short``: the reply was cut off (its line
    says so, or a ``transcript_cut`` line of its run names its item)."""
    entries: list[tuple[tuple[int, float, int], dict[str, Any]]] = []
    cut: set[tuple[int, Any]] = set()
    block = 0
    agents = agents_by_line(lines)
    for index, line in enumerate(lines):
        kind = line.get("kind")
        if kind == RecordKind.START:
            block += 1
        elif kind == RecordKind.TRANSCRIPT_CUT:
            cut.add((block, line.get("item_id")))
        elif kind == RecordKind.TRANSCRIPT and isinstance(line.get("text"), str):
            order = _number(line.get("order"))
            entry = {"role": line.get("role"), "text": line.get("text"), "item_id": line.get("item_id"),
                     "t": line.get("t"), "cut_short": line.get("cut_short") is True, "_block": block}
            if line.get("role") == "assistant" and agents[index] is not None:
                entry["agent"] = agents[index]     # who said it: the agent in charge when it was transcribed
            entries.append(((block, order if order is not None else float(index), index), entry))
    entries.sort(key=lambda pair: pair[0])
    out = []
    for _, entry in entries:
        if (entry.pop("_block"), entry["item_id"]) in cut:
            entry["cut_short"] = True
        out.append(entry)
    return out
