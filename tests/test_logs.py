"""Logging as configured (``voiceactors.logs``): loggers bound once and kept,
yet following a later configuration; a dropped line runs no processor; the
scrubber's inlined path hides what ``scrub`` hides. The cost itself is not
timed here: it shows in the benchmarks' CPU per connect and per round."""

from __future__ import annotations

import datetime
import io
import json
import logging

import hypothesis
import structlog
from structlog.testing import capture_logs

from voiceactors import logs

TOKEN = "tok-logs-test-0123456789abcdef"
OPENAI_KEY = "sk-logs-test-9f8e7d6c5b4a"
REGISTERED = "plainkey-logs-test-4411"


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_logger_used_before_a_configure_follows_the_new_one():
    log = logs.get_logger(actor="testing")
    first, second = io.StringIO(), io.StringIO()
    try:
        logs.configure("json", "info", stream=first)
        log.info("testing.first", n=1)
        logs.configure("json", "info", stream=second)
        log.info("testing.second", n=2)
        log.debug("testing.dropped")                 # level info: not written
        logs.configure("json", "debug", stream=second)
        log.debug("testing.kept")
    finally:
        structlog.reset_defaults()
    assert [x["event"] for x in _lines(first)] == ["testing.first"]
    assert [(x["event"], x["actor"], x["level"]) for x in _lines(second)] == [
        ("testing.second", "testing", "info"), ("testing.kept", "testing", "debug")]


def test_capture_logs_sees_a_logger_that_was_already_used():
    log = logs.get_logger(actor="testing")
    try:
        logs.configure("json", "info", stream=io.StringIO())
        log.info("testing.before")
        with capture_logs() as captured:
            log.info("testing.captured", n=3)
        log.info("testing.after")
    finally:
        structlog.reset_defaults()
    assert captured == [{"actor": "testing", "n": 3, "event": "testing.captured", "log_level": "info"}]


def test_a_dropped_line_runs_no_processor():
    seen: list[str] = []

    def counting(_logger, _name, event_dict):
        seen.append(event_dict["event"])
        return event_dict

    log = logs.get_logger(actor="testing")
    try:
        structlog.configure(processors=[counting, structlog.processors.JSONRenderer()],
                            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
                            logger_factory=structlog.WriteLoggerFactory(file=io.StringIO()))
        log.debug("testing.dropped", value=object())
        log.info("testing.kept")
    finally:
        structlog.reset_defaults()
    assert seen == ["testing.kept"]


def test_a_logged_line_hides_every_secret_the_scrubber_hides():
    logs.register_secret(REGISTERED)
    stream = io.StringIO()
    log = logs.get_logger(actor="testing")
    try:
        logs.configure("json", "info", stream=stream)
        log.info("testing.secrets", api_token=TOKEN, openai_api_key=OPENAI_KEY, Authorization=f"Bearer {TOKEN}",
                 ephemeral_key="ek_abcdef123456", client_secret={"value": "ek_abcdef123456"}, token=12345,
                 detail=f"upstream said: invalid key {OPENAI_KEY} for Bearer {TOKEN}",
                 nested={"headers": {"authorization": "Basic dXNlcjpwYXNz"}}, items=[f"key {REGISTERED}"],
                 plain=f"registered {REGISTERED} in the middle")
        log.info("testing.harmless", token_required=True, input_tokens=812, api_token=False, ephemeral_key=None,
                 keys=["a", "b"], reason="no_api_key", ratio=1.5, text="nothing to hide here")
    finally:
        structlog.reset_defaults()
    text = stream.getvalue()
    assert not [s for s in (TOKEN, OPENAI_KEY, REGISTERED, "ek_abcdef", "12345", "dXNlcjpwYXNz") if s in text], text
    secrets_line, harmless = _lines(stream)
    assert secrets_line["api_token"] == "[redacted]" and secrets_line["token"] == "[redacted]"
    assert secrets_line["plain"] == "registered [redacted] in the middle"
    assert {k: harmless[k] for k in ("token_required", "input_tokens", "api_token", "ephemeral_key", "keys",
                                     "reason", "ratio", "text")} == {
        "token_required": True, "input_tokens": 812, "api_token": False, "ephemeral_key": None,
        "keys": ["a", "b"], "reason": "no_api_key", "ratio": 1.5, "text": "nothing to hide here"}


@hypothesis.given(hypothesis.strategies.integers(min_value=0, max_value=4_102_444_800 * 10**9)
                  | hypothesis.strategies.integers(min_value=0, max_value=4_102_444_800).map(lambda s: s * 10**9))
def test_the_timestamp_is_written_as_structlogs_iso_utc_stamper_writes_the_instant(ns: int) -> None:
    # TimeStamper(fmt="iso", utc=True): datetime.isoformat with Z, no fraction on a whole second
    # (the second strategy: whole seconds, where the fraction is left out)
    moment = datetime.datetime.fromtimestamp(ns // 10**9, datetime.timezone.utc).replace(
        microsecond=ns // 1000 % 10**6)
    assert logs._iso_utc(ns) == moment.isoformat().replace("+00:00", "Z")


def test_a_lines_timestamp_is_now_in_utc() -> None:
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    try:
        before = datetime.datetime.now(datetime.timezone.utc)
        logs.get_logger(actor="test").info("test.stamped")
        after = datetime.datetime.now(datetime.timezone.utc)
    finally:
        structlog.reset_defaults()
    line = json.loads(stream.getvalue())
    assert line["timestamp"].endswith("Z") and list(line)[-1] == "timestamp"
    stamped = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    assert before <= stamped <= after


def test_a_string_logged_before_a_secret_is_registered_is_hidden_after_it():
    """The scrubber remembers strings it found clean (a line's values
    repeat); a secret registered later (an MCP server's token, while
    serving) must still be hidden in them."""
    later = "laterkey-logs-test-7788"
    stream = io.StringIO()
    log = logs.get_logger(actor="testing")
    try:
        logs.configure("json", "info", stream=stream)
        for _ in range(3):
            log.info("testing.before", detail=f"upstream {later}", other="plain")
        logs.register_secret(later)
        log.info("testing.after", detail=f"upstream {later}", other="plain")
    finally:
        structlog.reset_defaults()
    *before, after = _lines(stream)
    assert [x["detail"] for x in before] == [f"upstream {later}"] * 3
    assert after["detail"] == "upstream [redacted]" and after["other"] == "plain"


_texts = hypothesis.strategies.sampled_from(
    ["plain", "briefing.get", "ok", OPENAI_KEY, f"Bearer {TOKEN}", REGISTERED, "sk-", "ek_short", ""]) | \
    hypothesis.strategies.text(max_size=12)


@hypothesis.given(hypothesis.strategies.lists(
    hypothesis.strategies.dictionaries(
        hypothesis.strategies.sampled_from(["detail", "tool", "api_token", "timestamp", "n", "flag", "items"]),
        _texts | hypothesis.strategies.integers() | hypothesis.strategies.booleans()
        | hypothesis.strategies.lists(_texts, max_size=2), max_size=5),
    min_size=1, max_size=6))
def test_the_line_processor_scrubs_as_scrub_does_on_every_line_however_often_a_value_repeats(lines) -> None:
    logs.register_secret(REGISTERED)
    for fields in lines:
        want = {name: logs._scrub_field(name, value) for name, value in fields.items()}
        assert logs._scrub_processor(None, "info", dict(fields)) == want
