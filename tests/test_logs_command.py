"""``voiceactors logs``: the server's own JSON lines (written by its logger,
``logs.configure("json", ...)``) rendered for a person, filtered by call and
by actor, read from a file, from stdin and from a file that grows while it
is followed; a line that is not JSON printed as it is; the exit codes."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from child_support import CHILD_START_S, Child, die_with_parent
from voiceactors import logs
from voiceactors.cli import main as cli_main
from voiceactors.commands import EXIT_INTERRUPTED, EXIT_USAGE

CALL_A, CALL_B = "rtc_u1_9c65", "rtc_u1_77ab"
NOT_JSON = "Traceback (most recent call last): not a JSON line"
COMMAND = [sys.executable, "-m", "voiceactors.cli", "logs"]


def _server_lines(log_stream) -> list[str]:
    """Lines as the server writes them: its logger, its processors, its renderer."""
    logs.get_logger(actor="server").info("server.serving", urls=["http://127.0.0.1:8765"], demo=False)
    logs.get_logger(actor="call", call_id=CALL_A).info("call.connected", epoch=1)
    logs.get_logger(actor="tools").info("tool.run", call_id=CALL_A, tool="journal.get_day", turn=1,
                                        duration_ms=12.5, outcome="ok")
    logs.get_logger(actor="http").info("http.request", method="POST", path="/api/voice/session", status=200,
                                       detail="two words")
    logs.get_logger(actor="call", call_id=CALL_B).warning("call.connect_failed", attempt=2)
    try:
        raise RuntimeError("the handler broke")
    except RuntimeError:
        logs.get_logger(actor="tools").exception("tool.failed", call_id=CALL_B, tool="journal.search")
    return log_stream.getvalue().splitlines()


@pytest.fixture
def log_file(tmp_path, log_stream) -> tuple[Path, list[dict]]:
    """A log file of the server's lines with a line that is not JSON among them."""
    lines = _server_lines(log_stream)
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines[:3] + [NOT_JSON] + lines[3:]) + "\n")
    return path, [json.loads(line) for line in lines]


def _time(line: dict) -> str:
    stamp = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _run(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli_main(["logs", *args])
    return code, capsys.readouterr().out.splitlines()


def test_each_line_reads_time_level_actor_event_then_its_fields(log_file, capsys):
    path, lines = log_file
    code, out = _run([str(path)], capsys)
    assert code == 0
    serving, connected, tool_run, request, connect_failed, failed = lines
    assert out[0] == (f"{_time(serving)}  info     server      server.serving            "
                      'urls=["http://127.0.0.1:8765"] demo=false')
    assert out[1] == f"{_time(connected)}  info     call        call.connected            call_id={CALL_A} epoch=1"
    assert out[2] == (f"{_time(tool_run)}  info     tools       tool.run                  call_id={CALL_A} "
                      "tool=journal.get_day turn=1 duration_ms=12.5 outcome=ok")
    assert out[3] == NOT_JSON
    assert out[4] == (f"{_time(request)}  info     http        http.request              method=POST "
                      'path=/api/voice/session status=200 detail="two words"')
    assert out[5] == (f"{_time(connect_failed)}  warning  call        call.connect_failed       "
                      f"call_id={CALL_B} attempt=2")
    assert out[6].startswith(f"{_time(failed)}  error    tools       tool.failed               "
                             f"call_id={CALL_B} tool=journal.search")
    traceback = out[7:]       # the exception's lines, indented below its line
    assert traceback[0] == "    Traceback (most recent call last):"
    assert traceback[-1] == "    RuntimeError: the handler broke"
    assert all(row.startswith("    ") for row in traceback)


def test_a_call_keeps_its_lines_and_every_line_that_is_not_json(log_file, capsys):
    path, _ = log_file
    code, out = _run([str(path), "--call", CALL_A], capsys)
    assert code == 0
    assert [row.split()[4] for row in out if row != NOT_JSON] == ["call.connected", "tool.run"]
    assert NOT_JSON in out


def test_an_actor_keeps_its_lines_and_both_filters_meet(log_file, capsys):
    path, _ = log_file
    _, out = _run([str(path), "--actor", "call"], capsys)
    assert [row.split()[4] for row in out if row != NOT_JSON] == ["call.connected", "call.connect_failed"]
    _, out = _run([str(path), "--actor", "tools", "--call", CALL_B], capsys)
    assert [row.split()[4] for row in out if row.startswith("20")] == ["tool.failed"]


def test_stdin_is_read_for_a_dash_and_for_no_file(log_file):
    path, _ = log_file
    for args in (["-", "--actor", "http"], ["--actor", "http"]):
        done = subprocess.run(COMMAND + args, input=path.read_text(), capture_output=True, text=True,
                              timeout=CHILD_START_S, preexec_fn=die_with_parent())
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == NOT_JSON
        assert done.stdout.splitlines()[1].split()[4] == "http.request"
        assert len(done.stdout.splitlines()) == 2


def test_a_missing_file_is_a_usage_error(tmp_path, capsys):
    code = cli_main(["logs", str(tmp_path / "absent.log")])
    assert code == EXIT_USAGE
    assert "no file at" in capsys.readouterr().err


async def _read_until(stream: trio.abc.ReceiveStream, seen: bytearray, text: str) -> None:
    with trio.fail_after(CHILD_START_S):    # a child process: real time, bounded
        while text.encode() not in seen:
            chunk = await stream.receive_some()
            assert chunk, f"the output ended before {text!r}: {seen.decode()}"
            seen += chunk


async def test_follow_prints_what_a_growing_file_gains_and_stops_on_ctrl_c(log_file):
    path, lines = log_file
    child = Child(COMMAND + [str(path), "--follow", "--call", CALL_B],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stderr is not None
        seen = bytearray()
        await _read_until(child.stdout, seen, "RuntimeError: the handler broke")   # the file as it was
        later = dict(lines[1], call_id=CALL_B, event="call.ended", reason="shutdown")
        with path.open("a") as log:
            text = json.dumps(later) + "\n"
            log.write(text[:20])            # half a line: printed only once it is whole
            log.flush()
            log.write(text[20:])
            log.write(json.dumps(dict(later, call_id=CALL_A, event="call.other")) + "\n")   # another call's
        await _read_until(child.stdout, seen, "call.ended")
        path.write_text(json.dumps(dict(later, event="call.after_truncation")) + "\n")   # cut and started again
        await _read_until(child.stdout, seen, "call.after_truncation")
        child.send_signal(signal.SIGINT)
        with trio.fail_after(CHILD_START_S):
            assert await child.wait() == EXIT_INTERRUPTED
        rest = bytearray()
        while chunk := await child.stderr.receive_some():
            rest += chunk
        assert b"Traceback" not in rest
        shown = seen.decode()
        assert "call.other" not in shown
        assert f"call.ended                call_id={CALL_B} epoch=1 reason=shutdown" in shown
    finally:
        if child.poll() is None:
            child.kill()
