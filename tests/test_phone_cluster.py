"""Two ``voiceactors serve --redis`` processes on one real redis-server: the
same phone webhook delivered to both at once gives one accept and one actor
(the delivery claimed once in Redis, the call's lease won once), and a
replay of it to either afterwards acts no more."""

from __future__ import annotations

import json

import pytest
import trio

from calls_support import DAY, KEY
from cluster_support import ClusterServer, started_calls, stop_all
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.simulator import phone as sim_phone

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

OWNER = "+15551234567"


async def test_one_webhook_to_two_workers_gives_one_accept_and_one_actor(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    secret = sim_phone.new_secret()
    config = journal / "config" / "journal.json"
    data = json.loads(config.read_text()) if config.exists() else {}
    data["voice"] = {**data.get("voice", {}), "webhook_secret": secret, "phone": {"allowed_callers": [OWNER]}}
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(data))
    sim = Simulator(None, api_key=KEY)
    call = sim.place_phone_call([{"sleep": 1.0}, {"user_turn": {"text": "Anything due?"}},
                                 {"response": {"text": "Nothing today."}}, {"sleep": 120}])
    sent = sim_phone.delivery(sim_phone.incoming_event(call.call_id, sim_phone.sip_headers(OWNER)), secret)
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(2)]
            urls = [await server.start(nursery) for server in servers]
            answers: list[tuple[int, dict]] = []

            async def deliver(url: str) -> None:
                answer = await sim_phone.post(url, sent)
                answers.append((answer.status_code, answer.json()))

            async with trio.open_nursery() as racers:        # the same delivery to both at once
                for url in urls:
                    racers.start_soon(deliver, url)
            assert sorted(a["status"] for _, a in answers) == ["accepted", "duplicate"], answers
            assert all(status == 200 for status, _ in answers)
            with trio.fail_after(20):
                await call.wait_until(lambda c: c.connection is not None and c.response_creates >= 1)
            for url in urls:                                 # a later retry, to either: nothing again
                answer = await sim_phone.post(url, sent)
                assert answer.json() == {"status": "duplicate"}
            assert call.accepted is not None and call.rejected_with is None
            assert started_calls(*servers) == [call.call_id]
            assert [h["call_id"] for h in sim.handshakes] == [call.call_id] and call.connections == 1
            accepted = [s for s in servers if s.events("phone.call_accepted")]
            assert len(accepted) == 1
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
