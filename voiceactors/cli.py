"""voiceactors: talk with your journal through OpenAI's voice models.

Each subcommand lives beside what it runs; this module only parses arguments
and dispatches (imports are lazy so ``voiceactors --help`` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from voiceactors import settings

# subcommand -> "module:function"; the function takes the parsed args and returns an exit code
_COMMANDS = {
    "serve": "voiceactors.server:cli_serve",
    "serve-demo": "voiceactors.demo:cli_serve_demo",     # the server never imports the simulator
    "demo": "voiceactors.demo:cli_demo",
    "simulate": "voiceactors.simulator.command:cli_simulate",
    "phone-call": "voiceactors.simulator.command:cli_phone_call",
    "replay": "voiceactors.replay:cli_replay",
    "fuzz": "voiceactors.fuzz.command:cli_fuzz",
    "index": "voiceactors.journal.search:cli_index",
    "journal-sample": "voiceactors.journal.sample:cli_sample",
    "calls": "voiceactors.calls_report:cli_calls",
    "logs": "voiceactors.logs_view:cli_logs",
    "mcp": "voiceactors.mcp.server.stdio:cli_mcp",
}


# settings with a flag on `serve` and `demo` (`--demo`, `--redis` and `--workers` are serve's alone)
SERVE_FLAGS = ("journal", "host", "port", "state_dir", "log_format", "allowed_hosts", "call_budget_usd",
               "daily_budget_usd", "record_events")
# settings with a flag on `mcp` (stdio: no address to listen on)
MCP_FLAGS = ("journal", "state_dir", "log_format", "redis_url")


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    # the flags, their help and defaults come from the settings' declarations
    settings.add_flags(p, SERVE_FLAGS)
    p.add_argument("--today", help="pin today to YYYY-MM-DD (default: the local date; $VOICEACTORS_TODAY)")


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 200:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 200")
    return int(text)


_SERVE_ABOUT = ("Serve the voice console (open the address it prints in a browser) and its API on your journal. "
                "Calls need an OpenAI key: OPENAI_API_KEY, read when the server starts, or voice.openai_api_key "
                "in the journal's config/journal.json, read again at each call (no restart). With --demo: a "
                "sample journal and the simulator, no key.")
_EPILOG = "New here? `voiceactors serve --demo` serves the console on a sample journal, no OpenAI key needed."

# one-shot commands that print their own result: their info log lines (JSON on stderr) would only
# repeat it, or land in the middle of a progress bar
_QUIET_COMMANDS = frozenset({"index", "journal-sample", "calls", "logs"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voiceactors", description=__doc__.splitlines()[0], epilog=_EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the voice server", description=_SERVE_ABOUT)
    _add_serve_flags(serve)
    settings.add_flags(serve, ("demo", "redis_url", "workers"))

    demo = sub.add_parser("demo", help="run server and simulator, drive one scripted call, print what happened",
                          description="Without a browser: start the server and the Realtime simulator on a sample "
                                      "journal, play the demo's scripted call, and print what happened. No OpenAI key "
                                      "needed.")
    _add_serve_flags(demo)

    mcp = sub.add_parser("mcp", help="serve the journal's tools over MCP on stdin/stdout (for desktop assistants)")
    settings.add_flags(mcp, MCP_FLAGS)
    mcp.add_argument("--today", help="pin today to YYYY-MM-DD (default: the local date; $VOICEACTORS_TODAY)")

    simulate = sub.add_parser("simulate", help="run the local OpenAI Realtime simulator")
    simulate.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    simulate.add_argument("--port", type=int, default=8766,
                          help="port to listen on (default 8766; point OPENAI_BASE_URL at http://HOST:PORT/v1)")
    simulate.add_argument("--scenario", help="scenario played on every joined call (name or file)")

    phone = sub.add_parser("phone-call", help="place a phone call to a running server through its simulator",
                           description="Offline: the simulator the server talks to (OPENAI_BASE_URL) places a call "
                                       "to the project's SIP address and posts its signed realtime.call.incoming "
                                       "webhook to the server, then plays the call (docs/phone.md).")
    phone.add_argument("--from", dest="from_number", metavar="NUMBER", help="the caller's number (E.164: +15551234567)")
    phone.add_argument("--withheld", action="store_true", help="the caller withholds their number")
    phone.add_argument("--asserted", metavar="NUMBER", help="a P-Asserted-Identity the trunk sets")
    phone.add_argument("--header", action="append", metavar="'NAME: VALUE'", help="another INVITE header (repeatable)")
    phone.add_argument("--demo", action="store_true",
                       help="against `serve --demo`: its webhook secret and the caller its sample journal lets in")
    phone.add_argument("--server", default="http://127.0.0.1:8765", help="the server (default http://127.0.0.1:8765)")
    phone.add_argument("--simulator", metavar="URL",
                       help="the simulator's base URL (default: the server's, from its console configuration)")
    phone.add_argument("--secret", help="the webhook secret (default $OPENAI_WEBHOOK_SECRET)")
    phone.add_argument("--key", help="the simulator's standard key (default $OPENAI_API_KEY, else the demo's)")
    phone.add_argument("--token", help="the server's API token, to read its configuration ($VOICEACTORS_API_TOKEN)")
    phone.add_argument("--scenario", help="the scenario the call plays (name or file; default the simulator's)")
    phone.add_argument("--dtmf", metavar="KEYS", help="keys the caller presses once the call is joined (2468#)")
    phone.add_argument("--dtmf-after", type=float, default=2.0, metavar="S",
                       help="seconds after the accept before the keys (default 2)")
    phone.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="how long to follow the call (default 60)")

    replay = sub.add_parser("replay", help="play a captured call against this server; report what we sent that differs")
    replay.add_argument("file", help="the capture (a <state_dir>/captures/<call id>.jsonl)")
    replay.add_argument("--journal", help="the journal the tools read (default: a sample journal for --today)")
    replay.add_argument("--today", help="pin today to YYYY-MM-DD (default: the expectation's, else today)")
    replay.add_argument("--expect", help="the expectation file (default: FILE with .expected.json for .jsonl)")
    replay.add_argument("--update", action="store_true", help="write the expectation from this run")
    replay.add_argument("--capture", metavar="SCENARIO",
                        help="first make FILE: run this simulator scenario (name or path) with record_events on")
    replay.add_argument("--speed", type=float, default=1.0, help="divide the recorded gaps between events (default 1)")
    replay.add_argument("--timeout", type=float, default=10.0,
                        help="seconds a gate waits for our output or response.create (default 10)")

    fuzz_parser = sub.add_parser("fuzz", help="replay a captured call many times with its timing changed; "
                                              "check that every run keeps the call's invariants")
    fuzz_parser.add_argument("file", help="the capture (a <state_dir>/captures/<call id>.jsonl)")
    fuzz_parser.add_argument("--runs", type=int, default=20, help="how many runs (default 20)")
    fuzz_parser.add_argument("--seed", type=int, help="the first run's seed; run N takes SEED+N (default: drawn)")
    fuzz_parser.add_argument("--keep", help="only these changes of each run's schedule (indices, comma-separated: "
                                            "what a failure's replay line gives)")
    fuzz_parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                             help="runs at once, each in a process of its own (default: the cores, at most 4)")
    fuzz_parser.add_argument("--journal", help="the journal the tools read (default: a sample journal for --today)")
    fuzz_parser.add_argument("--today", help="pin today to YYYY-MM-DD (default: the expectation's, else today)")

    index = sub.add_parser("index", help="build or refresh the journal search index")
    index.add_argument("--journal", required=True, metavar="DIR", help="the journal folder to index")
    index.add_argument("--state-dir", help="state folder (default .state)")
    index.add_argument("--no-progress", action="store_true", help="no progress bar")

    calls = sub.add_parser("calls", help="recent calls from the call records: duration, tool calls, tokens, cost")
    calls.add_argument("--state-dir", default=os.environ.get("VOICEACTORS_STATE_DIR") or str(settings.default("state_dir")),
                       help="state folder (default .state; $VOICEACTORS_STATE_DIR)")
    calls.add_argument("--limit", type=_limit, default=20, metavar="N",
                       help="how many of the newest calls (1-200, default 20)")
    calls.add_argument("--json", action="store_true", help='print {"calls": [...]} as GET /api/voice/calls does')

    logs = sub.add_parser("logs", help="the server's JSON log lines, readable: time, level, actor, event, fields",
                          description="Render the server's log lines (one JSON object per line, as `serve` writes "
                                      "them on stderr) for a person: time, level, actor, event, then the other "
                                      "fields as key=value. A line that is not JSON is printed as it is.")
    logs.add_argument("file", nargs="?", default="-", metavar="FILE",
                      help="the log file (default -: standard input, e.g. `journalctl -u voiceactors -o cat | "
                           "voiceactors logs`)")
    logs.add_argument("--call", metavar="ID", help="only the lines of this call (their call_id)")
    logs.add_argument("--actor", metavar="NAME", help="only the lines of this actor (call, tools, http, supervisor, ...)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep reading FILE as it grows, like tail -f (Ctrl-C stops)")

    journal = sub.add_parser("journal", help="journal utilities")
    jsub = journal.add_subparsers(dest="journal_command", required=True)
    sample = jsub.add_parser("sample", help="write a realistic sample journal")
    sample.add_argument("dir", help="where to write it: a missing or empty folder, or an earlier sample")
    sample.add_argument("--days", type=int, default=14,
                        help="how many days, ending --today (default 14; over 60 days the sample is much bigger)")
    sample.add_argument("--today", help="the sample's today, YYYY-MM-DD (default: today)")
    sample.add_argument("--seed", type=int, default=0,
                        help="the random seed: the same seed and days give the same journal (default 0)")
    for command in sub.choices.values():
        command.set_defaults(parser_of_command=command)
    sample.set_defaults(parser_of_command=sample)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:   # the subcommand's own usage, not the top level's
        args.parser_of_command.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)   # `serve --workers` starts its workers with these
    from voiceactors import logs

    # Logs go to stderr as JSON lines (console for people); stdout stays for command output.
    key = "journal-sample" if args.command == "journal" else args.command
    logs.configure(fmt=getattr(args, "log_format", None) or "json",
                   level="warning" if key in _QUIET_COMMANDS else "info")
    if key == "serve" and args.demo:
        key = "serve-demo"
    module_name, func_name = _COMMANDS[key].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
