"""Shared ``AsyncOpenAI`` clients, one per (key, base URL).

Building an ``AsyncOpenAI`` client costs about 46 ms of CPU on the trio
thread (the SDK builds its resources and an httpx client): one per mint let
a flood of mints starve live calls, and the ``openai`` brain backend built
one per run. A client is reentrant, so its users share one per (key, base
URL) and its connection pool: the HTTP routes' table mints session keys
(``VoiceState``), the brain backend keeps its own (a different timeout).
The table is bounded (a key edited many times must not grow it); a client
pushed out is closed once the requests using it are done. Every client
built counts in ``voiceactors_openai_clients_created_total``.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import AsyncIterator

import openai
import trio

from voiceactors import metrics

SDK_RETRIES = 0          # callers retry (the browser, the brain actor); one here doubles the worst-case wait


@dataclass
class _Entry:
    client: openai.AsyncOpenAI
    users: int = 0
    evicted: bool = False


class OpenAIClients:
    """A bounded table of shared clients; ``use(key, base_url)`` lends one."""

    def __init__(self, max_clients: int, timeout_s: float) -> None:
        self.max_clients = max(1, max_clients)
        self.timeout_s = timeout_s
        self.created = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, key: str, base_url: str) -> tuple[_Entry, list[_Entry]]:
        ident = (key, base_url)
        entry = self._entries.pop(ident, None)
        if entry is None:
            entry = _Entry(openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=self.timeout_s,
                                              max_retries=SDK_RETRIES))
            self.created += 1
            metrics.openai_client_created()
        self._entries[ident] = entry
        pushed_out = []
        while len(self._entries) > self.max_clients:
            _, old = self._entries.popitem(last=False)
            old.evicted = True
            pushed_out.append(old)
        return entry, pushed_out

    @contextlib.asynccontextmanager
    async def use(self, key: str, base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
        entry, pushed_out = self._entry(key, base_url)
        for old in pushed_out:
            await self._close_if_idle(old)
        entry.users += 1
        try:
            yield entry.client
        finally:
            entry.users -= 1
            await self._close_if_idle(entry)

    async def _close_if_idle(self, entry: _Entry) -> None:
        if entry.evicted and entry.users == 0:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await entry.client.close()

    async def aclose(self) -> None:
        """Close every client (at shutdown)."""
        entries, self._entries = list(self._entries.values()), OrderedDict()
        for entry in entries:
            entry.evicted = True
            await self._close_if_idle(entry)
