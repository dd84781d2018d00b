"""Linked context, verified: ``verify`` looks a context up in the journal
(blocking, for a worker thread: the ``journal.select`` handler calls it in the
executor's) and ``resolve`` runs it from trio within a bounded time (the HTTP
routes). The values and texts are in ``voiceactors/linked_context/references.py``."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import trio

from voiceactors import storage
from voiceactors.linked_context.references import (AMBIGUOUS, CANDIDATES_MAX, DAY_RE, NOT_FOUND, TIMEOUT, UNREADABLE, Reference,
                                 Resolution, Unverified, day_name, flat)
from voiceactors.journal import entities as journal_entities
from voiceactors.journal import facets as journal_facets
from voiceactors.journal import ledger as journal_ledger
from voiceactors.journal.paths import SLUG_RE, InvalidName, inside
from voiceactors.logs import get_logger

_log = get_logger(actor="context")


def _verify_day(journal: Path, ident: str) -> Resolution:
    try:
        day = _dt.date.fromisoformat(ident)
    except ValueError:
        return Unverified("day", NOT_FOUND)
    if not DAY_RE.fullmatch(ident) or not inside(journal, "chronicle", day.strftime("%Y%m%d")).is_dir():
        return Unverified("day", NOT_FOUND)
    return Reference("day", day.isoformat(), day_name(day), date=day.isoformat())


def _entity_ref(entity: journal_entities.Entity) -> Reference:
    return Reference("entity", entity.id, flat(entity.name), entity_type=entity.type or None)


def _verify_entity(journal: Path, ident: str) -> Resolution:
    """An exact id first; else a case-insensitive name / aka / id match that
    must be unique (several matches are ``ambiguous``). Blocked entities are
    never found."""
    if SLUG_RE.fullmatch(ident) and ".." not in ident:
        exact = journal_entities.load_entity(journal, ident)
        if exact is not None:
            return Unverified("entity", NOT_FOUND) if exact.blocked else _entity_ref(exact)
    wanted = " ".join(ident.split()).casefold()
    matches = [e for e in journal_entities.load_entities(journal).values()
               if any(" ".join(n.split()).casefold() == wanted for n in (e.name, e.id, *e.aka))]
    if not matches:
        return Unverified("entity", NOT_FOUND)
    if len(matches) > 1:
        return Unverified("entity", AMBIGUOUS, tuple(_entity_ref(e) for e in matches[:CANDIDATES_MAX]))
    return _entity_ref(matches[0])


def _verify_commitment(journal: Path, ident: str) -> Resolution:
    item = journal_ledger.get_item(journal, ident)
    if item is None:
        return Unverified("commitment", NOT_FOUND)
    opened = _dt.datetime.fromtimestamp(item.opened_at / 1000, tz=_dt.timezone.utc).date().isoformat()
    return Reference("commitment", item.id, flat(item.action), date=opened)


def _verify_facet(journal: Path, ident: str) -> Resolution:
    facet = journal_facets.get_facet(journal, ident)
    if facet is None:
        return Unverified("facet", NOT_FOUND)
    return Reference("facet", facet.slug, flat(facet.title))


_VERIFIERS = {"day": _verify_day, "entity": _verify_entity, "commitment": _verify_commitment,
              "facet": _verify_facet}


def verify(journal: Path, kind: str, ident: str) -> Resolution:
    """Look ``kind``/``ident`` up in the journal (blocking: run it in a
    worker thread). Never raises for a missing or unreadable item."""
    verifier = _VERIFIERS.get(kind)
    if verifier is None or not isinstance(ident, str) or not ident.strip():
        return Unverified(str(kind), NOT_FOUND)
    try:
        return verifier(Path(journal), ident.strip())
    except InvalidName:
        return Unverified(kind, NOT_FOUND)
    except OSError as exc:
        _log.warning("context.unreadable", kind=kind, error=type(exc).__name__)
        return Unverified(kind, UNREADABLE)
    except Exception as exc:  # noqa: BLE001 - a corrupt journal is "unreadable", never a crash
        _log.error("context.verify_failed", kind=kind, error=type(exc).__name__)
        return Unverified(kind, UNREADABLE)


async def resolve(journal: Path, kind: str, ident: str, timeout_s: float) -> Resolution:
    """``verify`` in a worker thread, bounded by ``timeout_s`` in all: a
    journal read that hangs gives ``Unverified(kind, "timeout")`` on time
    (the thread is abandoned and ends when its read does)."""
    started = trio.current_time()
    with trio.move_on_after(timeout_s):
        result = await storage.run_sync(verify, journal, kind, ident)
        _log.info("context.resolved", kind=kind, verified=isinstance(result, Reference),
                  reason=getattr(result, "reason", None),
                  duration_ms=round((trio.current_time() - started) * 1000, 1))
        return result
    _log.warning("context.timed_out", kind=kind, timeout_s=timeout_s)
    return Unverified(kind, TIMEOUT)
