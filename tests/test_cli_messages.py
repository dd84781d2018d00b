"""The command line as a person meets it: every option says what it is, and
each mistake exits non-zero with the message that tells what to do."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from voiceactors.cli import build_parser, main as cli_main
from voiceactors.journal.sample import BIG_DAYS, disk_bytes, estimated_bytes


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((f"{prefix}{name}", sub))
                found.extend(_commands(sub, f"{prefix}{name} "))
    return found


def test_every_option_of_every_command_has_help_text():
    commands = _commands(build_parser())
    assert {name for name, _ in commands} >= {"serve", "demo", "mcp", "simulate", "replay", "index", "calls",
                                             "journal", "journal sample"}
    missing = [f"{name} {action.option_strings or action.dest}"
               for name, sub in commands for action in sub._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not (action.help or "").strip()]
    assert missing == []


def test_the_top_level_help_says_what_the_command_is_and_where_to_start(capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "talk with your journal" in out and "voiceactors serve --demo" in out and "``" not in out


def test_a_zero_budget_says_it_means_no_budget(capsys):
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default 0 = no budget; $VOICEACTORS_CALL_BUDGET_USD)" in out
    assert "(default 0 = no budget; $VOICEACTORS_DAILY_BUDGET_USD)" in out


def test_serve_says_what_it_serves_and_what_a_call_needs(capsys):
    """``serve --help`` was a bare list of flags: nothing said that calls
    need an OpenAI key, where it goes, or which place needs a restart."""
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Serve the voice console" in out
    assert "OPENAI_API_KEY, read when the server starts" in out
    assert "voice.openai_api_key in the journal's config/journal.json, read again at each call" in out


@pytest.mark.parametrize("argv, usage", [
    (["serve", "--bogus"], "usage: voiceactors serve "),
    (["calls", "--bogus"], "usage: voiceactors calls "),
    (["journal", "sample", "x", "--bogus"], "usage: voiceactors journal sample "),
])
def test_an_unknown_option_shows_the_usage_of_its_own_command(argv, usage, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "error: unrecognized arguments: --bogus" in err


def test_calls_with_a_missing_state_folder_fails_and_says_so(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert cli_main(["calls", "--state-dir", str(missing)]) == 2
    captured = capsys.readouterr()
    assert f"no state folder at {missing}" in captured.err and captured.out == ""


def test_calls_in_an_empty_state_folder_says_where_it_looked_and_why_a_demo_is_not_there(tmp_path, capsys):
    assert cli_main(["calls", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"no calls recorded in {tmp_path / 'calls'}" in out and "--state-dir" in out


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voiceactors.cli", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_index_keeps_its_progress_bar_free_of_log_lines(tmp_path):
    journal = tmp_path / "journal"
    made = _run("journal", "sample", str(journal), "--days", "3", "--today", "2026-03-10", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    done = _run("index", "--journal", str(journal), "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "{" not in done.stderr          # no JSON log line in the middle of the bar
    assert done.stdout.startswith("indexed ")


def test_a_big_sample_says_how_big_before_writing_and_its_size_after(tmp_path):
    days = BIG_DAYS + 1
    made = _run("journal", "sample", str(tmp_path / "j"), "--days", str(days), "--today", "2026-03-10",
                cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    said = made.stderr.strip()
    assert said.startswith(f"writing a {days}-day sample journal: about ") and said.endswith("(Ctrl-C stops)")
    on_disk = disk_bytes(tmp_path / "j")
    assert 0.8 < estimated_bytes(days) / on_disk < 1.25       # "about" means about
    assert made.stdout.rstrip().endswith(f"({on_disk / 1e6:.0f} MB on disk)")


def test_a_small_sample_writes_without_a_warning(tmp_path):
    made = _run("journal", "sample", str(tmp_path / "j"), "--days", "2", "--today", "2026-03-10", cwd=tmp_path)
    assert made.returncode == 0 and made.stderr == ""
