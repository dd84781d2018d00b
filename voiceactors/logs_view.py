"""``voiceactors logs``: the server's JSON log lines, for a person to read.

The format on disk stays one JSON object per line (``logs.py``); this reads
those lines from a file or stdin and prints each one readably::

    2026-03-27 09:00:00.120  info     call        call.ended  call_id=rtc_u1_9c65 reason=shutdown epoch=2

the time (UTC, to the millisecond), the level, the actor, the event, then
the line's other fields as ``key=value`` in the order the line has them
(``call_id`` first). A traceback (``exception``) follows on its own indented
lines. ``--call`` and ``--actor`` keep the lines of one call or one actor. A
line that is not a JSON object (a Python traceback of a crash, a shell's
message) is printed as it is, whatever the filters: it belongs to no call,
and hiding it could hide why a process died. ``--follow`` keeps reading the
file as it grows, as ``tail -f`` does, from a rotated or truncated file's
new start too, until Ctrl-C (exit 130).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from voiceactors.commands import EXIT_INTERRUPTED, EXIT_USAGE

STDIN = "-"
#: The fields every line has, shown in their own columns, not as ``key=value``.
COLUMN_FIELDS = ("timestamp", "level", "actor", "event")
#: A traceback ``format_exc_info`` put on the line: printed below it, indented.
EXCEPTION_FIELD = "exception"
LEVEL_WIDTH = len("warning")
ACTOR_WIDTH = len("supervisor")
EVENT_WIDTH = 24      # most events fit: their fields start in one column
#: How often ``--follow`` looks for more of the file once it has read it all.
FOLLOW_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class LineFilter:
    """Which JSON lines to print: those of one call, of one actor, or both."""

    call_id: str | None = None
    actor: str | None = None

    def keeps(self, line: dict[str, Any]) -> bool:
        if self.call_id is not None and line.get("call_id") != self.call_id:
            return False
        return self.actor is None or line.get("actor") == self.actor


def _time(stamp: Any) -> str:
    """``2026-03-27T09:00:00.120456Z`` as ``2026-03-27 09:00:00.120``; anything else as it is."""
    text = str(stamp) if stamp is not None else "-"
    if len(text) >= 19 and text[10] == "T":
        day_and_time = text[:10] + " " + text[11:19]
        fraction = text[19:].rstrip("Z")
        return day_and_time + (fraction[:4] if fraction.startswith(".") else ".000")
    return text


def _value(value: Any) -> str:
    """A field's value as one token: a plain word bare, anything else as JSON."""
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _fields(line: dict[str, Any]) -> list[str]:
    names = [name for name in line if name not in COLUMN_FIELDS and name != EXCEPTION_FIELD]
    if "call_id" in names:      # the one field a reader follows a call by
        names.remove("call_id")
        names.insert(0, "call_id")
    return [f"{name}={_value(line[name])}" for name in names]


def render(line: dict[str, Any]) -> str:
    """One JSON log line as text (without its newline)."""
    head = [_time(line.get("timestamp")), str(line.get("level", "-")).ljust(LEVEL_WIDTH),
            str(line.get("actor", "-")).ljust(ACTOR_WIDTH), str(line.get("event", "-")).ljust(EVENT_WIDTH)]
    text = "  ".join(head + [" ".join(_fields(line))]).rstrip()
    trace = line.get(EXCEPTION_FIELD)
    if trace:
        text += "".join("\n    " + row for row in str(trace).rstrip("\n").splitlines())
    return text


def view(raw: str, keep: LineFilter) -> str | None:
    """What to print for one raw line (without its newline), or None to skip it."""
    try:
        line = json.loads(raw)
    except ValueError:
        line = None
    if not isinstance(line, dict):
        return raw if raw.strip() else None
    return render(line) if keep.keeps(line) else None


def show(lines: Iterable[str], keep: LineFilter, out: TextIO) -> None:
    """Print each line's view as it comes (a followed file's line at once)."""
    for raw in lines:
        shown = view(raw.rstrip("\r\n"), keep)
        if shown is not None:
            out.write(shown + "\n")
            out.flush()


def _same_file(path: Path, opened: TextIO) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(opened.fileno()).st_ino
    except OSError:     # rotated away and not yet made again: keep reading the old one
        return True


def follow(path: Path, poll_s: float = FOLLOW_POLL_S) -> Iterator[str]:
    """Every whole line of the file, then each line appended to it, forever.

    A partial last line waits for its newline. A file truncated below what
    was read is read again from its start; a file replaced (rotated: a new
    inode at the path) is read from the new one's start once the old one
    has nothing more."""
    source = open(path, encoding="utf-8", errors="replace", newline="")
    try:
        pending = ""
        while True:
            chunk = source.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
                continue
            if not _same_file(path, source):
                source.close()
                source, pending = open(path, encoding="utf-8", errors="replace", newline=""), ""
                continue
            if os.fstat(source.fileno()).st_size < source.tell():
                source.seek(0)
                pending = ""
                continue
            time.sleep(poll_s)
    finally:
        source.close()


@contextlib.contextmanager
def _lines_of(args: argparse.Namespace) -> Iterator[Iterable[str]]:
    if args.file in (None, STDIN):
        if isinstance(sys.stdin, io.TextIOWrapper):   # a stray byte is shown, not a crash
            sys.stdin.reconfigure(errors="replace")
        yield sys.stdin           # following stdin is reading it: it ends when its writer does
    elif args.follow:
        yield follow(Path(args.file))
    else:
        with open(args.file, encoding="utf-8", errors="replace", newline="") as source:
            yield source


def cli_logs(args: argparse.Namespace) -> int:
    if args.file not in (None, STDIN) and not Path(args.file).is_file():
        print(f"voiceactors logs: no file at {args.file} (give a log file, or - for stdin)", file=sys.stderr)
        return EXIT_USAGE
    keep = LineFilter(call_id=args.call, actor=args.actor)
    try:
        with _lines_of(args) as lines:
            show(lines, keep, sys.stdout)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:     # `voiceactors logs FILE | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # so that the interpreter's last flush does not fail
    return 0
