"""A sideband reads the service's frames written back to back in one socket read.

trio-websocket's reader asks the socket for 4 KiB at a time by default; the
service writes a response's ~16 frames (6–7 KB in the benchmarks' rounds)
back to back, so they came in several reads, each a hand-off and a schedule
point, with our reader woken between them. The
sideband asks for 64 KiB (``sideband.RECEIVE_BYTES``, the public
``receive_buffer_size``): what one TCP write put in the socket reaches our
reader in one ``get_messages`` batch. Over real loopback sockets, with the
hand-written peer of ``tests/test_ws_frames.py`` (it decides which frames
share a TCP write).
"""

from __future__ import annotations

import json

import trio
import trio.testing

from test_ws_frames import Peer
from voiceactors.realtime import ws_frames
from voiceactors.realtime.sideband import RECEIVE_BYTES, open_sideband


async def test_frames_written_at_once_reach_the_reader_in_one_batch() -> None:
    # 40 frames of ~1 KB, ~41 KB in one TCP write: ten 4 KiB reads, one of 64 KiB
    texts = [json.dumps({"type": "response.output_text.delta", "n": i, "delta": "x" * 1000}) for i in range(40)]
    assert 4096 * 4 < sum(len(t) for t in texts) < RECEIVE_BYTES
    async with trio.open_nursery() as nursery:
        peer = Peer()
        await nursery.start(peer.serve)
        async with open_sideband(f"http://127.0.0.1:{peer.port}/v1", "sk-test-receive", "rtc_receive",
                                 connect_timeout=5) as ws:
            await peer.ready.wait()
            ws_frames.hand_off_at_once(ws)
            got: list[list[str | bytes]] = []

            async def read() -> None:
                got.append(await ws_frames.get_messages(ws))

            async with trio.open_nursery() as inner:
                inner.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()    # our reader waits in get_messages
                await peer.write(*texts)                      # one TCP write
            assert got == [texts]      # all forty in the first batch (4 KiB reads: the first read's few)
            nursery.cancel_scope.cancel()
