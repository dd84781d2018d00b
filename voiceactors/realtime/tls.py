"""The client TLS contexts of this process, each made once.

A TLS client context loads a CA store when it is made: ~30 ms of CPU for
``ssl.create_default_context()`` (the system's store) and ~45 ms for
httpx's default (certifi's bundle) on this machine. trio-websocket makes
one for every ``wss`` connect it is not given one for, and an
``httpx.AsyncClient`` for every client it builds, on the trio thread. The
sideband and the call's hangup use these instead: one per process, not
one per connect.
Each is the library's own default, so what is trusted and verified
(certificates, host names) does not change. The sideband's is made at the
first ``wss`` connect in a worker thread (loading the store is blocking file
work); the hangup's when a supervisor that hangs up starts, in a worker
thread (``REST.get``), and otherwise at the first hangup on the trio thread
(``REST.now``), as every hangup made its own before: a worker-thread wait
there would be a wait inside the close's deadline. A CA store changed on
disk is read by the next process.
"""

from __future__ import annotations

import ssl
from typing import Callable

import httpx

from voiceactors import storage

__all__ = ["OnceContext", "SIDEBAND", "REST"]


class OnceContext:
    """A TLS client context made by ``make`` at the first ``get``, then kept."""

    def __init__(self, make: Callable[[], ssl.SSLContext]) -> None:
        self._make = make
        self.made: ssl.SSLContext | None = None   # a view for tests

    async def get(self) -> ssl.SSLContext:
        """The context, made in a worker thread the first time."""
        if self.made is None:
            context = await storage.run_sync(self._make)
            if self.made is None:      # another caller's thread may have finished first
                self.made = context
        return self.made

    def now(self) -> ssl.SSLContext:
        """The context, made on this thread the first time."""
        if self.made is None:
            self.made = self._make()
        return self.made


def _websocket_default() -> ssl.SSLContext:
    return ssl.create_default_context()        # trio-websocket's own call for a wss URL


def _httpx_default() -> ssl.SSLContext:
    return httpx.create_ssl_context()           # an httpx.AsyncClient's own default


#: the sideband's
SIDEBAND = OnceContext(_websocket_default)
#: the call's hangup
REST = OnceContext(_httpx_default)
