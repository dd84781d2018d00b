"""How a call arrives (``call/arrival.py``): every kind has its entry, and a
browser's connect opens the call's sideband under the configured base URL."""

from __future__ import annotations

import trio

from voiceactors.call.arrival import ARRIVALS, ArrivalKind, arrive
from voiceactors.call.transport import TransportUnavailable
from voiceactors.settings import Settings


def test_every_kind_of_arrival_has_its_entry():
    assert set(ARRIVALS) == set(ArrivalKind)


async def test_a_browser_arrival_opens_the_sideband_under_the_base_url(tmp_path):
    """Nothing listens at the base URL's port: the opener reaches for it (and
    says so in the seam's terms), so the arrival carries the settings' URL."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()                                   # a port nothing listens on
    settings = Settings(journal=tmp_path, state_dir=tmp_path / "state").replace(openai_base_url=f"http://127.0.0.1:{port}/v1",
                                                  connect_timeout_s=2.0)
    arrival = arrive(ArrivalKind.BROWSER, settings, "rtc_arrives")
    assert (arrival.kind, arrival.call_id) == (ArrivalKind.BROWSER, "rtc_arrives")
    try:
        async with arrival.open_transport("sk-test"):
            raise AssertionError("a transport opened where nothing listens")
    except TransportUnavailable:
        pass
