"""Sign-in is rate-limited, and wrong tokens cost more (issue 11, leftovers).

``POST /api/voice/login`` shares the per-client limit of the costly POSTs,
and each refused token keeps a token of a stricter bucket of its own (5 at
once, one back a minute); right tokens give theirs back. Through the Quart
test client (the client address set per request) on ``autojump_clock``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio

from clock_support import serving
from voiceactors.http import create_app
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
TOKEN = "login-limit-token-7f3a91c2"
ALICE = {"client": ("127.0.0.1", 50001)}
BOB = {"client": ("127.0.0.2", 50002)}


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("login") / "journal", days=1, today=DAY)


def _app(journal: Path, tmp_path: Path, **changes: Any) -> Any:
    return create_app(Settings(journal=journal, state_dir=tmp_path / "state", api_token=TOKEN).replace(**changes))


async def _login(client: Any, token: str, who: dict) -> Any:
    return await client.post("/api/voice/login", json={"token": token}, scope_base=who)


async def test_wrong_tokens_are_limited_per_client_and_right_ones_cost_nothing(journal, tmp_path, settled_clock):
    async with serving(_app(journal, tmp_path)) as test_app:
        client = test_app.test_client()
        for _ in range(4):
            assert (await _login(client, "wrong", ALICE)).status_code == 401
        for _ in range(10):                       # signing in with the right token keeps nothing
            assert (await _login(client, TOKEN, ALICE)).status_code == 200
        assert (await _login(client, "wrong", ALICE)).status_code == 401      # the fifth wrong one
        refused = await _login(client, "wrong", ALICE)
        assert refused.status_code == 429
        assert await refused.get_json() == {"error": "too many requests"}
        assert 55 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["Connection"] == "close"
        # locked out: even the right token waits (a 200 would confirm a guess)
        assert (await _login(client, TOKEN, ALICE)).status_code == 429
        # another client has its own bucket
        assert (await _login(client, "wrong", BOB)).status_code == 401
        assert (await _login(client, TOKEN, BOB)).status_code == 200
        await trio.sleep(61)                      # one try back a minute, not more
        assert (await _login(client, "wrong", ALICE)).status_code == 401
        assert (await _login(client, "wrong", ALICE)).status_code == 429
        await trio.sleep(61)
        assert (await _login(client, TOKEN, ALICE)).status_code == 200


async def test_parallel_guesses_cannot_overdraw_the_bucket(journal, tmp_path, settled_clock):
    statuses: list[int] = []
    async with serving(_app(journal, tmp_path)) as test_app:
        client = test_app.test_client()

        async def guess(n: int) -> None:
            statuses.append((await _login(client, f"guess-{n}", ALICE)).status_code)

        async with trio.open_nursery() as nursery:
            for n in range(15):
                nursery.start_soon(guess, n)
    assert statuses.count(401) == 5 and statuses.count(429) == 10


async def test_sign_in_shares_the_limit_of_the_costly_posts(journal, tmp_path, settled_clock):
    async with serving(_app(journal, tmp_path, rate_limit_burst=3)) as test_app:
        client = test_app.test_client()
        for _ in range(3):
            assert (await _login(client, TOKEN, ALICE)).status_code == 200
        assert (await _login(client, TOKEN, ALICE)).status_code == 429


async def test_no_limit_when_rate_limits_are_off(journal, tmp_path):
    async with serving(_app(journal, tmp_path, rate_limit_per_s=0)) as test_app:
        client = test_app.test_client()
        for _ in range(30):
            assert (await _login(client, "wrong", ALICE)).status_code == 401
        assert (await _login(client, TOKEN, ALICE)).status_code == 200
