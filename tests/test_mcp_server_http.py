"""``/mcp``: the journal's nine tools over MCP Streamable HTTP, tested with
the SDK's own client against a real server on loopback, on a sample journal
the test writes."""

from __future__ import annotations

import contextlib
import json
from functools import partial
from pathlib import Path

import httpx
import httpx2
import pytest
import trio
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.exceptions import OAuthRegistrationError
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPError

from conftest import SAMPLE_TODAY
from mcp_server_support import MODES, POST_HEADERS, TOKEN, mcp_client, rpc, served
from voiceactors import clock, storage
from voiceactors.executor import write_log
from voiceactors.http import create_app, serving
from voiceactors.http.errors import NO_OAUTH
from voiceactors.journal import ledger
from voiceactors.mcp.server.tools import CLIENT_EVENTS_META_KEY, IDEMPOTENCY_META_KEY
from voiceactors.server import hypercorn_config
from voiceactors.settings import Settings
from voiceactors.tools import ToolContext
from voiceactors.tools.registry import JOURNAL_TOOLS, REGISTRY, WRITE

#: One call of every tool, with arguments the sample journal answers.
READ_CALLS = {
    "journal.get_day": {"day": SAMPLE_TODAY},
    "journal.search": {"query": "board deck"},
    "entities.get": {"entity_slug": "Sam Okafor"},
    "entities.recent_with": {"entity_slug": "Sam Okafor", "days": 14},
    "commitments.list": {"state": "open"},
    "calendar.today": {},
    "briefing.get": {},
    "observer.start_listening": {"mode": "meeting"},
}


@pytest.fixture
def journal(make_sample, pin_today) -> Path:
    pin_today(SAMPLE_TODAY)
    return make_sample(days=14)


def settings_for(journal: Path, tmp_path: Path, **changes) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state").replace(
        rate_limit_per_s=0, mcp_rate_limit_per_s=0, **changes)


def direct_answer(journal: Path, tmp_path: Path, name: str, args: dict) -> dict:
    """What the tool's handler answers on the same journal, the model-facing
    part (no ``_`` keys)."""
    ctx = ToolContext(journal, tmp_path / "direct-state", today=clock.today)
    raw = REGISTRY[name].handler(ctx, dict(args))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def open_commitment(journal: Path) -> str:
    [item, *_] = ledger.list_items(journal, state="open", top=1)
    return item.id


def commitment_state(journal: Path, item_id: str) -> str:
    [item] = [i for i in ledger.list_items(journal, top=500) if i.id == item_id]
    return item.state


@pytest.mark.parametrize("mode", MODES)
async def test_the_tools_listed_are_the_registrys(journal, tmp_path, mode):
    async with served(settings_for(journal, tmp_path)) as base, mcp_client(base, mode=mode) as client:
        listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == list(JOURNAL_TOOLS)
    for tool in listed:
        spec = REGISTRY[tool.name]
        assert tool.description == spec.description
        assert tool.input_schema == spec.parameters
        writes = spec.effect == WRITE
        assert (tool.annotations.read_only_hint, tool.annotations.destructive_hint) == (not writes, writes)
    assert [t.name for t in listed if not t.annotations.read_only_hint] == ["commitments.complete"]


@pytest.mark.parametrize("mode", MODES)
async def test_each_read_tool_answers_what_the_journal_says(journal, tmp_path, mode):
    assert set(READ_CALLS) | {"commitments.complete"} == set(JOURNAL_TOOLS)
    async with served(settings_for(journal, tmp_path)) as base, mcp_client(base, mode=mode) as client:
        results = {name: await client.call_tool(name, args) for name, args in READ_CALLS.items()}
    for name, result in results.items():
        assert not result.is_error, (name, result.structured_content)
        assert result.structured_content == direct_answer(journal, tmp_path, name, READ_CALLS[name]), name
        [text] = result.content
        assert json.loads(text.text) == result.structured_content, name
    assert results["journal.get_day"].structured_content["segments"]
    assert results["commitments.list"].structured_content["commitments"]
    # an event meant for the voice client reaches the MCP client in _meta
    assert results["observer.start_listening"].meta[CLIENT_EVENTS_META_KEY] == [
        {"type": "observer_action", "action": {"type": "start_observer", "mode": "meeting"}}]
    assert results["entities.get"].meta[CLIENT_EVENTS_META_KEY][0]["type"] == "nav_hint"


async def test_the_write_tool_closes_a_commitment_in_the_journal(journal, tmp_path):
    item_id = open_commitment(journal)
    async with served(settings_for(journal, tmp_path)) as base, mcp_client(base) as client:
        result = await client.call_tool("commitments.complete", {"commitment_id": item_id, "resolution": "done"})
    assert not result.is_error
    assert result.structured_content["ok"] is True
    assert result.structured_content["commitment"]["id"] == item_id
    assert commitment_state(journal, item_id) == "closed"


async def test_a_write_with_the_same_idempotency_key_applies_once_across_a_restart(journal, tmp_path):
    item_id = open_commitment(journal)
    settings = settings_for(journal, tmp_path)

    async def complete(client, resolution: str, key: str):
        return await client.call_tool("commitments.complete", {"commitment_id": item_id, "resolution": resolution},
                                      meta={IDEMPOTENCY_META_KEY: key})

    async with served(settings) as base, mcp_client(base) as client:
        first = await complete(client, "done", "close-7f3a")
        # the same key again, even asking for something else: the first answer, nothing applied
        again = await complete(client, "dropped", "close-7f3a")
        assert commitment_state(journal, item_id) == "closed"
    assert (again.structured_content, again.is_error) == (first.structured_content, False)
    assert first.structured_content["commitment"]["state"] == "closed"

    async with served(settings) as base, mcp_client(base, mode="auto") as client:
        after_restart = await complete(client, "dropped", "close-7f3a")
        assert after_restart.structured_content == first.structured_content
        assert commitment_state(journal, item_id) == "closed"
        # another key is another write
        other = await complete(client, "dropped", "drop-91c2")
    assert other.structured_content["commitment"]["state"] == "dropped"
    assert commitment_state(journal, item_id) == "dropped"


async def test_writes_without_a_key_are_separate_writes_and_a_bad_key_is_refused(journal, tmp_path):
    item_id = open_commitment(journal)
    async with served(settings_for(journal, tmp_path)) as base, mcp_client(base) as client:
        done = await client.call_tool("commitments.complete", {"commitment_id": item_id, "resolution": "done"})
        dropped = await client.call_tool("commitments.complete", {"commitment_id": item_id, "resolution": "dropped"})
        bad = await client.call_tool("commitments.complete", {"commitment_id": item_id, "resolution": "done"},
                                     meta={IDEMPOTENCY_META_KEY: "not a key!"})
    assert done.structured_content["commitment"]["state"] == "closed"
    assert dropped.structured_content["commitment"]["state"] == "dropped"
    assert (bad.is_error, bad.structured_content) == (True, {"error": "invalid idempotency key"})
    assert commitment_state(journal, item_id) == "dropped"


async def test_the_executors_rules_hold_over_mcp(journal, tmp_path):
    settings = settings_for(journal, tmp_path, tool_output_cap=300)
    async with served(settings) as base, mcp_client(base) as client:
        invalid = await client.call_tool("journal.get_day", {"day": "27 March"})
        unknown = await client.call_tool("journal.delete_everything", {})
        # call-scoped: it changes a voice call's selection, and MCP has no call
        select = await client.call_tool("journal.select", {"kind": "day", "id": SAMPLE_TODAY})
        extra = await client.call_tool("calendar.today", {"surprise": 1})
        capped = await client.call_tool("journal.get_day", {"day": SAMPLE_TODAY})
        # more calls than a voice turn allows, each identical: no turn bound over MCP
        repeated = [await client.call_tool("calendar.today", {}) for _ in range(settings.tool_calls_per_turn + 2)]
    assert (invalid.is_error, invalid.structured_content) == (True, {"error": "invalid day"})
    assert (unknown.is_error, unknown.structured_content) == (True, {"error": "unknown tool"})
    assert (select.is_error, select.structured_content) == (True, {"error": "unknown tool"})
    assert "journal.select" not in JOURNAL_TOOLS
    assert extra.is_error and extra.structured_content["error"].startswith("invalid arguments")
    assert not capped.is_error and capped.structured_content["truncated"] is True
    assert len(capped.content[0].text) <= 300
    assert all(not r.is_error and "error" not in r.structured_content for r in repeated)


async def test_post_mcp_is_answered_there_not_redirected(journal, tmp_path):
    async with served(settings_for(journal, tmp_path)) as base, httpx.AsyncClient(base_url=base) as http:
        response = await http.post("/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
        slash = await http.post("/mcp/", json=rpc("tools/list"), headers=POST_HEADERS)
    assert response.status_code == 200 and "location" not in response.headers
    assert response.headers["content-type"].startswith("application/json")
    assert [t["name"] for t in response.json()["result"]["tools"]] == list(JOURNAL_TOOLS)
    assert response.headers["cache-control"] == "no-store" and response.headers["x-request-id"]
    assert "mcp-session-id" not in response.headers          # stateless
    assert slash.status_code == 404 and slash.json() == {"error": "not found"}


async def test_only_post_is_served(journal, tmp_path):
    # a GET used to open an event stream the server held until the client left
    async with served(settings_for(journal, tmp_path)) as base, httpx.AsyncClient(base_url=base, timeout=5) as http:
        answers = [await http.request(method, "/mcp", headers={"Accept": "application/json, text/event-stream"})
                   for method in ("GET", "DELETE", "PUT")]
    for response in answers:
        assert (response.status_code, response.json()) == (405, {"error": "method not allowed"})
        assert response.headers["allow"] == "POST"


async def test_off_loopback_the_token_is_required(journal, tmp_path):
    settings = settings_for(journal, tmp_path, host="0.0.0.0", api_token=TOKEN)
    async with served(settings) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            missing = await http.post("/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
            wrong = await http.post("/mcp", json=rpc("tools/list"),
                                    headers={**POST_HEADERS, "Authorization": f"Bearer {TOKEN}x"})
        for response in (missing, wrong):
            assert response.status_code == 401 and response.json() == {"error": "unauthorized"}
            # not a bare "Bearer": which token, in words, for a person reading the answer
            # (a client that looks for OAuth on a 401 is answered by the next test)
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith('Bearer realm="voiceactors", ') and "VOICEACTORS_API_TOKEN" in challenge
            assert "no OAuth server" in challenge
        with pytest.raises((MCPError, ExceptionGroup)):
            async with mcp_client(base, token="not-the-token") as client:
                await client.list_tools()
        for mode in MODES:
            async with mcp_client(base, token=TOKEN, mode=mode) as client:
                assert len((await client.list_tools()).tools) == len(JOURNAL_TOOLS)
                result = await client.call_tool("journal.get_day", {"day": SAMPLE_TODAY})
                assert not result.is_error


class NothingStored:
    """An OAuth client's storage with nothing in it: a first connection."""

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        raise AssertionError("no token can be issued: the server has no OAuth")

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        raise AssertionError("no client can be registered: the server has no OAuth")


#: Where MCP Inspector 2.x's client SDK looks for OAuth after a 401 on
#: ``/mcp``, in its order: protected-resource metadata (path-aware, then at
#: the root), authorization-server metadata, OpenID discovery, and when none
#: is found, registration at the origin's ``/register``, whose answer's body
#: its error shows.
INSPECTOR_DISCOVERY = (("GET", "/.well-known/oauth-protected-resource/mcp"),
                       ("GET", "/.well-known/oauth-protected-resource"),
                       ("GET", "/.well-known/oauth-authorization-server"),
                       ("GET", "/.well-known/openid-configuration"),
                       ("POST", "/register"))


async def test_a_client_looking_for_oauth_is_told_to_send_the_token(journal, tmp_path):
    settings = settings_for(journal, tmp_path, api_token=TOKEN)
    async with served(settings) as base:
        # The SDK's own OAuth client, as a client that meets the 401 without a token: its
        # discovery finds nothing and its registration is refused with our words.
        oauth = OAuthClientProvider(f"{base}/mcp", OAuthClientMetadata(redirect_uris=["http://127.0.0.1:9/callback"]),
                                    NothingStored())
        async with httpx2.AsyncClient(auth=oauth, timeout=20) as http:
            with pytest.raises(OAuthRegistrationError) as refused:
                await http.post(f"{base}/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
        assert NO_OAUTH in str(refused.value) and "404" in str(refused.value)
        async with httpx.AsyncClient(base_url=base) as http:
            answers = [await http.request(method, path, json={} if method == "POST" else None)
                       for method, path in INSPECTOR_DISCOVERY]
            elsewhere = await http.get("/.well-known/security.txt")
    for response in answers:
        assert (response.status_code, response.json()) == (404, {"error": NO_OAUTH})
    assert "VOICEACTORS_API_TOKEN" in NO_OAUTH and "Authorization: Bearer" in NO_OAUTH
    assert (elsewhere.status_code, elsewhere.json()) == (404, {"error": "not found"})


async def test_a_configured_token_is_required_on_loopback_too(journal, tmp_path):
    async with served(settings_for(journal, tmp_path, api_token=TOKEN)) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            response = await http.post("/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
        assert response.status_code == 401
        async with mcp_client(base, token=TOKEN) as client:
            assert len((await client.list_tools()).tools) == len(JOURNAL_TOOLS)


async def test_a_rebound_host_or_a_foreign_origin_is_refused(journal, tmp_path):
    async with served(settings_for(journal, tmp_path)) as base, httpx.AsyncClient(base_url=base) as http:
        rebound = await http.post("/mcp", json=rpc("tools/list"), headers={**POST_HEADERS, "Host": "evil.example"})
        port = base.rsplit(":", 1)[1]
        foreign = await http.post("/mcp", json=rpc("tools/list"),
                                  headers={**POST_HEADERS, "Origin": "http://evil.example"})
        cross_site = await http.post("/mcp", json=rpc("tools/list"),
                                     headers={**POST_HEADERS, "Sec-Fetch-Site": "cross-site"})
        own = await http.post("/mcp", json=rpc("tools/list"),
                              headers={**POST_HEADERS, "Origin": f"http://127.0.0.1:{port}"})
        localhost = await http.post(f"http://localhost:{port}/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
    assert (rebound.status_code, rebound.json()) == (421, {"error": "host not allowed"})
    assert (foreign.status_code, foreign.json()) == (403, {"error": "origin not allowed"})
    assert (cross_site.status_code, cross_site.json()) == (403, {"error": "cross-site request refused"})
    assert own.status_code == 200 and localhost.status_code == 200


async def test_the_body_limit_holds_declared_and_streamed(journal, tmp_path):
    async with served(settings_for(journal, tmp_path, body_limit=4096)) as base, \
            httpx.AsyncClient(base_url=base) as http:
        padded = rpc("tools/list", {"_meta": {"pad": "x" * 5000}})
        declared = await http.post("/mcp", content=json.dumps(padded).encode(), headers=POST_HEADERS)

        async def chunks():
            text = json.dumps(padded).encode()
            for start in range(0, len(text), 1000):
                yield text[start:start + 1000]

        streamed = await http.post("/mcp", content=chunks(), headers=POST_HEADERS)
        small = await http.post("/mcp", json=rpc("tools/list"), headers=POST_HEADERS)
        not_json = await http.post("/mcp", content=b"tools/list", headers={**POST_HEADERS, "Content-Type": "text/plain"})
    for response in (declared, streamed):
        assert (response.status_code, response.json()) == (413, {"error": "request body too large"})
        assert response.headers["connection"] == "close"
    assert "content-length" not in streamed.request.headers     # it really was streamed
    assert small.status_code == 200
    assert (not_json.status_code, not_json.json()) == (415, {"error": "content type must be application/json"})


async def test_each_client_has_a_rate_limit(journal, tmp_path):
    settings = settings_for(journal, tmp_path).replace(mcp_rate_limit_burst=3, mcp_rate_limit_per_s=0.01)
    async with served(settings) as base, httpx.AsyncClient(base_url=base) as http:
        answers = [await http.post("/mcp", json=rpc("tools/list", request_id=n), headers=POST_HEADERS)
                   for n in range(4)]
        # the voice API's buckets are not the MCP ones
        status = await http.get("/api/voice/status")
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    assert answers[3].json() == {"error": "too many requests"}
    assert int(answers[3].headers["retry-after"]) >= 1
    assert status.status_code == 200


async def test_shutdown_with_a_write_in_flight_is_bounded_and_applies_nothing_twice(journal, tmp_path):
    """A write waiting on a journal lock (another program holds it) when the
    server is told to stop: the server still stops within its shutdown
    deadline, the write records nothing (it never ran), and after a restart
    the retry with the same key applies it, once."""
    item_id = open_commitment(journal)
    settings = settings_for(journal, tmp_path, journal_lock_timeout_s=2.0)
    args = {"commitment_id": item_id, "resolution": "done"}
    key = {IDEMPOTENCY_META_KEY: "close-in-flight"}
    answers: list[object] = []
    with contextlib.ExitStack() as held:
        for day_file in sorted(journal.glob("facets/*/activities/*.jsonl")):
            held.enter_context(storage.file_lock(day_file))
        with trio.fail_after(settings.shutdown_deadline_s + 10):
            app = create_app(settings)
            config = hypercorn_config(settings.replace(port=0))
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                [base] = await nursery.start(partial(serving.serve, app, config, max_connections=0,
                                                     shutdown_trigger=stop.wait))

                async def call() -> None:
                    try:
                        async with mcp_client(base) as client:
                            answers.append(await client.call_tool("commitments.complete", args, meta=key))
                    except BaseException as error:    # the server went away mid-call: that is allowed
                        if isinstance(error, trio.Cancelled):
                            raise
                        answers.append(error)

                nursery.start_soon(call)
                lock = write_log.lock_path(settings.state_dir, "mcp:close-in-flight")
                while not Path(f"{lock}.lock").exists():      # the write has started in the executor
                    await trio.sleep(0.01)
                stop.set()
        assert write_log.load(settings.state_dir, "mcp:close-in-flight") is None
        assert commitment_state(journal, item_id) == "open"
    [answer] = answers
    if not isinstance(answer, BaseException):
        assert answer.is_error and answer.structured_content["error"].startswith("journal busy")
    async with served(settings) as base, mcp_client(base) as client:
        retried = await client.call_tool("commitments.complete", args, meta=key)
        again = await client.call_tool("commitments.complete", {**args, "resolution": "dropped"}, meta=key)
    assert retried.structured_content["commitment"]["state"] == "closed"
    assert again.structured_content == retried.structured_content
    assert commitment_state(journal, item_id) == "closed"


async def test_the_sdks_warnings_reach_our_log(journal, tmp_path, log_stream):
    async with served(settings_for(journal, tmp_path)) as base, httpx.AsyncClient(base_url=base) as http:
        notification = {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"_meta": "not an object"}}
        response = await http.post("/mcp", json=notification, headers=POST_HEADERS)
    assert response.status_code == 202
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    [relayed] = [line for line in lines if line["event"] == "mcp.sdk_message"]
    assert relayed["actor"] == "mcp" and relayed["level"] == "warning"
    assert relayed["message"] == "dropped 'notifications/initialized': malformed params"
