"""``Voice``: what the ``voice`` fixture gives a test. A journal of its own
(the sample journal, which the test may change before a call) and calls
served by the real call layer and tool executor, with the simulator as the
service behind the call's in-memory transport."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable

from voiceactors.call.call_context import LinkedContext
from voiceactors.http.routes import call_agents
from voiceactors.journal.sample import write_sample_journal
from voiceactors.testing.expect import CallResult
from voiceactors.testing.rig import DAY, rig
from voiceactors.testing.script import Script
from voiceactors.tools import REGISTRY, ToolSpec, make_registry

__all__ = ["INSTRUCTION", "Voice"]

#: The brain's instruction a kit call with agents starts from (no brain runs in a test).
INSTRUCTION = "You are the voice of this journal."


class Voice:
    """Calls against a journal under ``root`` (a test's ``tmp_path``).

    ``journal`` is written (the sample journal, ending on ``today``) when the
    ``Voice`` is made; write to it before a call. ``tools`` added to a call
    join the real ones (one of the same name replaces it)."""

    def __init__(self, root: Path, *, sample_days: int = 3) -> None:
        self.root = Path(root)
        self.journal = self.root / "journal"
        self.today = DAY
        if not self.journal.exists():
            write_sample_journal(self.journal, days=sample_days, today=DAY)
        self._ids = itertools.count(1)

    async def call(self, script: Script, *, tools: Iterable[ToolSpec] = (), call_id: str | None = None,
                   agents: bool = False, **settings: Any) -> CallResult:
        """Play ``script`` as one call to its end (the service closes it
        after the last step) and return what happened. ``agents``: the call
        has the journal's agents (``voice.agents`` in its config, else the
        shipped set: docs/agents.md), the first in charge, and their
        ``handoff.<agent>`` tools, as a call a browser connects has; the
        instruction each agent's part is added to is ``INSTRUCTION``.
        ``settings``: ``Settings`` fields for this call's runtime
        (``tool_timeout_read_s``, ``call_budget_usd``, …). Cancellation:
        cancelling the caller stops the call and the runtime under it."""
        call_id = call_id or f"rtc_test_{next(self._ids)}"
        added = list(tools)
        registry = make_registry([*(s for s in REGISTRY.values() if s.name not in {t.name for t in added}),
                                  *added]) if added else None
        async with rig(self.root, registry=registry, **settings) as r:
            context = LinkedContext(INSTRUCTION, None, agents=call_agents(r.settings)) if agents else None
            actor, service = await r.run_call(call_id, script.scenario(), context=context)
            record = r.record(call_id)
        return CallResult(call_id, actor, service, record)
