"""One call's timeline as an SVG picture, drawn from its record lines.

Time runs left to right in seconds since the call's first actor started (a
later run of the same call id continues where the previous one ended). Rows:
the model's responses (bars where the start is known, a cancelled one marked
as a barge-in on a line under the marks), the spoken turns (a mark when
each transcript arrived, its words in the tooltip; a reply cut short in the
barge-in colour), one row per tool call (its duration and outcome; its id
and epoch in the bar's tooltip), one per call of an OpenAI-hosted MCP tool
(run by the service: a mark when it ended, its server, tool and status),
a row for slow tool calls when there were any (the acknowledgement, the
wait for the answer, a progress line, its delivery), a row for the turns'
latency when the record has any (from the end of the user's speech, a bar to
the reply's first sound and, after a tool, a lighter one on to the answer's;
the parts in the tooltip), a row of agent spans when the call handed over
between agents (each agent's name over the time it was in charge,
docs/agents.md), and vertical marks for reconnects and the end. Text is escaped; the picture
has no script and no external reference, so it is safe as an ``<img>``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from voiceactors.call.handoff import in_charge_after
from voiceactors.call.state import ToolOutcome
from voiceactors.call.record_kind import RecordKind

WIDTH = 780
LABEL_W = 170          # the left column: row labels
LABEL_CHARS = 26       # of a hosted tool's label in that column (12 px text)
PLOT_RIGHT = 130       # room after the plot for the last bar's text
ROW_H = 22
TOP = 34
MAX_TOOL_ROWS = 40
LABEL_LINE_H = 14      # a line of "barge-in" labels under the responses' marks
BARGE_IN_LABEL_W = 56  # "barge-in" at 12 px, bold

OUTCOME_COLOURS: dict[str, str] = {ToolOutcome.OK: "#2f9e6b", ToolOutcome.REPLAYED: "#3a86c8",
                                   ToolOutcome.UNANSWERED: "#9a9a9a", ToolOutcome.PENDING: "#c9b458"}
FAILED_COLOUR = "#d9534f"
RESPONSE_COLOUR = "#7b68c8"
OURS_COLOUR = "#b39ddb"
CANCELLED_COLOUR = "#e8913a"
HOSTED_COLOUR = "#5b8a9a"
USER_COLOUR = "#8a8a96"
SPOKEN_TIP_MAX = 160   # characters of a transcript in its mark's tooltip
RECONNECT_COLOUR = "#c0392b"
ACK_COLOUR = "#3a86c8"       # a slow tool call acknowledged
WAIT_COLOUR = "#c9d8ea"      # ... the wait for its answer
DELIVERY_COLOUR = "#2f9e6b"  # ... its answer spoken
PROGRESS_COLOUR = "#8f7ac8"  # ... its one progress line spoken
SLOW_KINDS = frozenset({RecordKind.SLOW_ACK, RecordKind.SLOW_PROGRESS, RecordKind.SLOW_OUTPUT,
                        RecordKind.SLOW_DELIVERY})
FELT_COLOUR = "#d4a017"       # a turn: the end of speech to the first sound
ANSWER_COLOUR = "#f0dc9a"     # ... on to the answer after a tool
AGENT_COLOURS = ("#e3def7", "#d8eee3", "#f6e6d2", "#dbe8f5")   # agent spans, in turn
TEXT = "#2b2b33"
MUTED = "#6b6b78"


@dataclass
class Placed:
    """A record line with its time on the call's whole clock."""

    at: float
    line: dict[str, Any]


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def place(lines: list[dict[str, Any]]) -> list[Placed]:
    """Every line on one clock: each run's ``t`` plus the runs before it."""
    placed: list[Placed] = []
    offset, block_end = 0.0, 0.0
    for line in lines:
        if line.get("kind") == RecordKind.START and placed:
            offset += block_end
            block_end = 0.0
        t = _num(line.get("t"))
        block_end = max(block_end, t, _num(line.get("duration_s")) if line.get("kind") == RecordKind.END else 0.0)
        placed.append(Placed(offset + t, line))
    return placed


def _tool_rows(placed: list[Placed]) -> list[Placed]:
    """Each settled tool call, and each one only started (``pending``)."""
    settled = {p.line.get("tool_call_id") for p in placed if p.line.get("kind") == RecordKind.TOOL_CALL}
    rows = [p for p in placed if p.line.get("kind") == RecordKind.TOOL_CALL]
    for p in placed:
        if p.line.get("kind") == RecordKind.TOOL_STARTED and p.line.get("tool_call_id") not in settled:
            settled.add(p.line.get("tool_call_id"))
            rows.append(Placed(p.at, {**p.line, "outcome": ToolOutcome.PENDING, "duration_ms": None}))
    return rows


def _hosted_label(line: dict[str, Any]) -> str:
    return f"{line.get('server') or '?'} · {line.get('tool') or '?'}"


def _in_label_column(label: str) -> str:
    """``label`` cut to what the row labels' column holds (the whole in the tooltip)."""
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"


def _first_tool_at(tools: list[Placed]) -> dict[Any, float]:
    """Each response id's earliest tool call time, in one pass: a model
    response's bar starts there (a scan of every tool row per response was
    quadratic, seconds for a record of thousands of responses)."""
    first: dict[Any, float] = {}
    for tool in tools:
        key = tool.line.get("response_id")
        if key not in first or tool.at < first[key]:
            first[key] = tool.at
    return first


def _attr(**values: Any) -> str:
    return " ".join(f"{name.rstrip('_').replace('_', '-')}={quoteattr(str(v))}" for name, v in values.items())


def _text(x: float, y: float, body: str, **extra: Any) -> str:
    extra.setdefault("fill", TEXT)
    return f"<text {_attr(x=round(x, 1), y=round(y, 1), **extra)}>{escape(body)}</text>"


def _rect(x: float, y: float, w: float, h: float, fill: str, **extra: Any) -> str:
    return f"<rect {_attr(x=round(x, 1), y=round(y, 1), width=round(max(w, 3.0), 1), height=h, fill=fill, **extra)}/>"


def _tool_label(line: dict[str, Any]) -> str:
    duration = line.get("duration_ms")
    took = f"{_num(duration):.1f} ms" if duration is not None else "no duration"
    return f"{line.get('outcome', '?')} · {took}"


def _barge_in_labels(cancelled_xs: list[float]) -> list[tuple[float, int]]:
    """Where each "barge-in" label goes: its x and its line under the
    responses' marks (0, 1, ...). Labels sit below the marks, never beside
    them, so the next response's dot cannot cover one; a label that would
    run into the one before it on a line takes the next line."""
    placed: list[tuple[float, int]] = []
    line_ends: list[float] = []
    for at_x in cancelled_xs:
        left = at_x - 4
        line = next((i for i, end in enumerate(line_ends) if end + 6 <= left), len(line_ends))
        if line == len(line_ends):
            line_ends.append(0.0)
        line_ends[line] = left + BARGE_IN_LABEL_W
        placed.append((left, line))
    return placed


def render(lines: list[dict[str, Any]]) -> str:
    """The SVG document for one call's record lines."""
    placed = place(lines)
    responses = [p for p in placed if p.line.get("kind") == RecordKind.RESPONSE]
    tools = _tool_rows(placed)
    # the service's own (hosted) tool calls share the tool rows, in time order
    rows_of_tools = sorted(tools + [p for p in placed if p.line.get("kind") == RecordKind.HOSTED_TOOL],
                           key=lambda p: p.at)
    shown_tools, hidden_tools = rows_of_tools[:MAX_TOOL_ROWS], max(0, len(rows_of_tools) - MAX_TOOL_ROWS)
    creates = {p.line.get("response_id"): p.at for p in placed if p.line.get("kind") == RecordKind.RESPONSE_CREATE}
    first_tool_at = _first_tool_at(tools)
    span = max([p.at + _num(p.line.get("duration_ms")) / 1000 for p in placed]
               + [p.at + _num(p.line.get("answer_ms"), _num(p.line.get("first_audio_ms"))) / 1000 for p in placed
                  if p.line.get("kind") == RecordKind.TURN] + [1.0])
    plot_w = WIDTH - LABEL_W - PLOT_RIGHT

    def x(at: float) -> float:
        return LABEL_W + plot_w * at / span

    cancelled = [p for p in responses if p.line.get("status") == "cancelled"]
    labels = _barge_in_labels([x(p.at) for p in cancelled])
    label_lines = 1 + max((line for _, line in labels), default=-1)
    responses_h = ROW_H + label_lines * LABEL_LINE_H
    said = [p for p in placed if p.line.get("kind") == RecordKind.TRANSCRIPT]
    spoken_h = ROW_H if said else 0       # a record without transcripts draws as before
    slow = [p for p in placed if p.line.get("kind") in SLOW_KINDS]
    slow_h = ROW_H if slow else 0         # ... and one without slow tool calls
    turns = [p for p in placed if p.line.get("kind") == RecordKind.TURN]
    turns_h = ROW_H if turns else 0       # ... and one without turn lines
    spans = _agent_spans(placed, span)
    agents_h = ROW_H if spans else 0      # ... and one without handoffs
    tools_top = TOP + responses_h + spoken_h + slow_h + turns_h + agents_h
    rows = len(shown_tools) + (1 if hidden_tools else 0)
    plot_bottom = tools_top + rows * ROW_H
    legend_y = plot_bottom + 40
    legend, legend_last_y = _legend(legend_y, slow=bool(slow), turns=bool(turns))
    height = legend_last_y + 40      # room under the legend's last line, however many it wraps to
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" {_attr(width=WIDTH, height=height, viewBox=f"0 0 {WIDTH} {height}")} '
           'font-family="system-ui, sans-serif" font-size="12" role="img">',
           f"<title>{escape('call timeline')}</title>",
           _rect(0, 0, WIDTH, height, "#ffffff")]
    out += _axis(span, x, plot_bottom)
    # responses
    y = TOP
    out.append(_text(8, y + 15, "responses", font_weight="600"))
    for p in responses:
        line = p.line
        is_cancelled = line.get("status") == "cancelled"
        ours = line.get("origin") == "ours"
        begin = creates.get(line.get("response_id")) if ours else first_tool_at.get(line.get("response_id"))
        colour = CANCELLED_COLOUR if is_cancelled else (OURS_COLOUR if ours else RESPONSE_COLOUR)
        tip = f"response {line.get('response_id')} · {line.get('status')} · epoch {line.get('epoch')} · {line.get('origin')}"
        if begin is not None and begin < p.at:
            out.append(_rect(x(begin), y + 4, x(p.at) - x(begin), 14, colour, rx=3) [:-2]
                       + f"><title>{escape(tip)}</title></rect>")
        else:
            out.append(f'<circle {_attr(cx=round(x(p.at), 1), cy=y + 11, r=5, fill=colour)}><title>{escape(tip)}</title></circle>')
    for label_x, label_line in labels:
        out.append(_text(label_x, y + ROW_H + label_line * LABEL_LINE_H + 10, "barge-in",
                         fill=CANCELLED_COLOUR, font_weight="600"))
    if said:
        out += _spoken_row(said, x, TOP + responses_h, _cut_items(placed))
    if slow:
        out += _slow_row(slow, x, TOP + responses_h + spoken_h)
    if turns:
        out += _turns_row(turns, x, TOP + responses_h + spoken_h + slow_h)
    if spans:
        out += _agents_row(spans, x, TOP + responses_h + spoken_h + slow_h + turns_h)
    # tool calls
    for i, p in enumerate(shown_tools):
        line = p.line
        y = tools_top + i * ROW_H
        if line.get("kind") == RecordKind.HOSTED_TOOL:
            out += _hosted_row(x(p.at), y, line)
            continue
        outcome = str(line.get("outcome", ToolOutcome.UNANSWERED))
        colour = OUTCOME_COLOURS.get(outcome, FAILED_COLOUR)
        end = p.at + _num(line.get("duration_ms")) / 1000
        tip = f"{line.get('tool', '?')} · tool call {line.get('tool_call_id', '?')} · epoch {line.get('epoch', '?')}"
        out.append(_text(8, y + 15, str(line.get("tool", "?"))))
        out.append(_rect(x(p.at), y + 5, x(end) - x(p.at), 12, colour, rx=2)[:-2]
                   + f"><title>{escape(tip)}</title></rect>")
        out.append(_text(max(x(end), x(p.at) + 3) + 5, y + 15, _tool_label(line), fill=MUTED))
    if hidden_tools:
        out.append(_text(8, tools_top + len(shown_tools) * ROW_H + 15, f"… {hidden_tools} more tool calls",
                         fill=MUTED))
    # reconnects, later runs, the end
    for p in placed:
        kind = p.line.get("kind")
        if kind == RecordKind.RECONNECT:
            out += _mark(x(p.at), plot_bottom, f"reconnect {p.line.get('attempt', '')}".strip(), RECONNECT_COLOUR)
        elif kind == RecordKind.START and p.at > 0:
            out += _mark(x(p.at), plot_bottom, "new run", RECONNECT_COLOUR)
        elif kind == RecordKind.END:
            out += _mark(x(p.at), plot_bottom, f"end: {p.line.get('reason', '?')}", MUTED)
    kinds = Counter(p.line.get("kind") for p in placed)
    if kinds[RecordKind.START] > kinds[RecordKind.END] or not kinds[RecordKind.END]:
        out.append(_text(LABEL_W, TOP - 16, "no end recorded: the call is live or was cut short", fill=FAILED_COLOUR))
    out += legend
    out.append("</svg>")
    return "\n".join(out)


def _cut_items(placed: list[Placed]) -> set[Any]:
    """The item ids of the replies cut short: named by a ``transcript_cut``
    line, or by a transcript line that says so itself (the service's item
    ids are unique in a call)."""
    return {p.line.get("item_id") for p in placed
            if p.line.get("kind") == RecordKind.TRANSCRIPT_CUT
            or (p.line.get("kind") == RecordKind.TRANSCRIPT and p.line.get("cut_short") is True)}


def _spoken_row(said: list[Placed], x: Any, y: float, cut: set[Any]) -> list[str]:
    """The spoken turns' row: a mark per transcript where it arrived (the
    assistant's preambles and replies, the user's turns), its words in the
    tooltip."""
    out = [_text(8, y + 15, "spoken", font_weight="600")]
    for p in said:
        line = p.line
        user = line.get("role") == "user"
        is_cut = not user and line.get("item_id") in cut
        colour = CANCELLED_COLOUR if is_cut else (USER_COLOUR if user else RESPONSE_COLOUR)
        text = str(line.get("text") or "")
        words = text if len(text) <= SPOKEN_TIP_MAX else text[:SPOKEN_TIP_MAX - 1] + "…"
        tip = f"{'you' if user else 'assistant'}: {words}" + (" (cut short)" if is_cut else "")
        out.append(_rect(x(p.at), y + 6, 3.0, 10, colour, rx=1)[:-2] + f"><title>{escape(tip)}</title></rect>")
    return out


def _slow_row(lines: list[Placed], x: Any, y: float) -> list[str]:
    """The slow tool calls' row: a mark where a batch was acknowledged, a
    bar for each acknowledged call's wait (to its answer), a mark where the
    answers were spoken (their ``response.create``)."""
    out = [_text(8, y + 15, "slow tools", font_weight="600")]
    acked: dict[Any, float] = {}
    for p in lines:
        line, kind = p.line, p.line.get("kind")
        if kind == RecordKind.SLOW_ACK:
            acked[line.get("response_id")] = p.at
            tip = f"acknowledged after {_num(line.get('waited_ms')):.0f} ms · tool calls {line.get('tool_call_ids')}"
            out.append(_rect(x(p.at), y + 4, 3.0, 14, ACK_COLOUR, rx=1)[:-2] + f"><title>{escape(tip)}</title></rect>")
        elif kind == RecordKind.SLOW_OUTPUT and line.get("response_id") in acked:
            begin = acked[line.get("response_id")]
            tip = f"waited {_num(line.get('waited_ms')):.0f} ms for tool call {line.get('tool_call_id')}"
            out.append(_rect(x(begin) + 3, y + 8, x(p.at) - x(begin) - 3, 6, WAIT_COLOUR, rx=2)[:-2]
                       + f"><title>{escape(tip)}</title></rect>")
        elif kind == RecordKind.SLOW_PROGRESS:
            total = line.get("total")
            tip = f"progress spoken · {_num(line.get('progress')):g}" + (f" of {_num(total):g}" if total else "")
            out.append(_rect(x(p.at), y + 6, 3.0, 10, PROGRESS_COLOUR, rx=1)[:-2]
                       + f"><title>{escape(tip)}</title></rect>")
        elif kind == RecordKind.SLOW_DELIVERY:
            tip = f"answer spoken · {_num(line.get('since_ack_ms')):.0f} ms after the acknowledgement"
            out.append(_rect(x(p.at), y + 4, 3.0, 14, DELIVERY_COLOUR, rx=1)[:-2]
                       + f"><title>{escape(tip)}</title></rect>")
    return out


def _turns_row(turns: list[Placed], x: Any, y: float) -> list[str]:
    """The turns' row: from where the user's speech ended, a bar to the
    reply's first sound and, for a turn with a tool, a lighter one on to the
    answer after it; the numbers and who held the answer up in the tooltip."""
    out = [_text(8, y + 15, "turns (first sound)", font_weight="600")]
    for p in turns:
        line = p.line
        first = _num(line.get("first_audio_ms"))
        tip = f"turn {line.get('turn', '?')} · first sound after {first:.0f} ms"
        if line.get("answer_ms") is not None:
            answer = _num(line.get("answer_ms"))
            tip += (f" · the answer after a tool after {answer:.0f} ms (tools {_num(line.get('tools_ms')):.0f} ms, "
                    f"our overhead {_num(line.get('overhead_ms')):.0f} ms, "
                    f"the service {_num(line.get('service_ms')):.0f} ms)")
            if answer > first:
                out.append(_rect(x(p.at + first / 1000), y + 8, x(p.at + answer / 1000) - x(p.at + first / 1000), 6,
                                 ANSWER_COLOUR, rx=2)[:-2] + f"><title>{escape(tip)}</title></rect>")
        out.append(_rect(x(p.at), y + 5, x(p.at + first / 1000) - x(p.at), 12, FELT_COLOUR, rx=2)[:-2]
                   + f"><title>{escape(tip)}</title></rect>")
    return out


def _agent_spans(placed: list[Placed], end: float) -> list[tuple[float, float, str]]:
    """Each agent's time in charge (from, to, name), when the call handed
    over at least once (a handoff line that changed who is in charge)."""
    changes: list[tuple[float, str]] = []
    agent: str | None = None
    handed = False
    for p in placed:
        now = in_charge_after(p.line, agent)
        if now is not None and now != agent:
            handed = handed or p.line.get("kind") == RecordKind.HANDOFF
            changes.append((p.at if changes else 0.0, now))
        agent = now
    if not handed:
        return []
    return [(at, changes[i + 1][0] if i + 1 < len(changes) else end, name) for i, (at, name) in enumerate(changes)]


def _agents_row(spans: list[tuple[float, float, str]], x: Any, y: float) -> list[str]:
    """The agents' row: a span per agent's time in charge, its name on it."""
    out = [_text(8, y + 15, "agents", font_weight="600")]
    for i, (begin, end, name) in enumerate(spans):
        tip = f"agent {name} in charge · {begin:.1f} s to {end:.1f} s"
        out.append(_rect(x(begin), y + 3, x(end) - x(begin), 16, AGENT_COLOURS[i % len(AGENT_COLOURS)], rx=3)[:-2]
                   + f"><title>{escape(tip)}</title></rect>")
        out.append(_text(x(begin) + 4, y + 15, name))
    return out


def _hosted_row(at_x: float, y: float, line: dict[str, Any]) -> list[str]:
    """A hosted MCP tool's row: its label, a mark where it ended (the service
    ran it; its run time is not ours to know) and its status."""
    status = str(line.get("status") or "?")
    colour = FAILED_COLOUR if status == "failed" else HOSTED_COLOUR
    tip = f"hosted MCP tool {_hosted_label(line)} · item {line.get('item_id', '?')}"
    if line.get("error"):
        tip += f" · {line.get('error')}"
    return [_text(8, y + 15, _in_label_column(_hosted_label(line))),
            _rect(at_x, y + 5, 3.0, 12, colour, rx=1)[:-2] + f"><title>{escape(tip)}</title></rect>",
            _text(at_x + 8, y + 15, f"hosted · {status}", fill=MUTED)]


def _axis(span: float, x: Any, bottom: float) -> list[str]:
    step = next(s for s in (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 1e9) if span / s <= 12)
    out = [f'<line {_attr(x1=LABEL_W, y1=bottom, x2=round(x(span), 1), y2=bottom, stroke=MUTED)}/>']
    tick = 0.0
    while tick <= span + 1e-9:
        out.append(f'<line {_attr(x1=round(x(tick), 1), y1=TOP - 4, x2=round(x(tick), 1), y2=bottom, stroke="#ececf1")}/>')
        out.append(_text(x(tick), bottom + 15, f"{tick:g} s", fill=MUTED, text_anchor="middle"))
        tick += step
    return out


def _mark(at_x: float, bottom: float, label: str, colour: str) -> list[str]:
    return [f'<line {_attr(x1=round(at_x, 1), y1=TOP - 6, x2=round(at_x, 1), y2=bottom, stroke=colour, stroke_dasharray="4 3")}/>',
            # a label near the right edge ends at its mark instead of running off the picture
            _text(at_x - 3, TOP - 6, label, fill=colour, text_anchor="end") if at_x > WIDTH - 160
            else _text(at_x + 3, TOP - 6, label, fill=colour)]


def _legend(y: float, *, slow: bool = False, turns: bool = False) -> tuple[list[str], float]:
    """The legend's marks and labels from ``y`` on, and its last line's y
    (``slow``: with the slow tool calls' marks; ``turns``: the turns')."""
    items = [("response (model)", RESPONSE_COLOUR), ("response (after our tool outputs)", OURS_COLOUR),
             ("cancelled response (barge-in)", CANCELLED_COLOUR), ("tool ok", OUTCOME_COLOURS[ToolOutcome.OK]),
             ("tool replayed", OUTCOME_COLOURS[ToolOutcome.REPLAYED]), ("tool failed / timed out", FAILED_COLOUR),
             ("tool pending (no outcome recorded)", OUTCOME_COLOURS[ToolOutcome.PENDING]),
             ("hosted MCP tool (run by the service)", HOSTED_COLOUR), ("you spoke (transcript)", USER_COLOUR),
             ("reconnect", RECONNECT_COLOUR)]
    if slow:
        items += [("slow tool acknowledged", ACK_COLOUR), ("waiting for its answer", WAIT_COLOUR),
                  ("its progress spoken", PROGRESS_COLOUR), ("its answer spoken", DELIVERY_COLOUR)]
    if turns:
        items += [("end of your speech to the first sound", FELT_COLOUR),
                  ("on to the answer after a tool", ANSWER_COLOUR)]
    out, at = [], 8.0
    for label, colour in items:
        width = 22 + 6.4 * len(label)
        if at + width > WIDTH:
            at, y = 8.0, y + 20
        out.append(_rect(at, y - 10, 12, 12, colour, rx=2))
        out.append(_text(at + 16, y, label, fill=MUTED))
        at += width
    return out, y
