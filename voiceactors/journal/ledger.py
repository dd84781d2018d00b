"""The commitments ledger: derived from activity records, never stored.

There is no ledger file. Every record's ``commitments[]`` entry is an item,
its ``closures[]`` entries close items by fuzzy match, and ``edits[]`` entries
with ``fields == ["ledger_close"]`` close or drop them by hand. The rules (see
``docs/journal-format.md``):

* item id = first 16 hex of sha256 of ``"<owner_entity_id>|<normalized
  action>|<counterparty_entity_id>"`` (missing ids are ``''``); the same id in
  several records is one item whose fields come from the earliest record
  (order: record ``created_at``, facet, day, record id);
* a story closure matches an item when the owner ids match (both missing
  counts), the counterparty ids match (both missing: the normalized names must
  be equal; only one present: no match) and the normalized actions score
  ``fuzz.token_sort_ratio >= 78``. Items take closures in opening order and a
  closure is consumed by the first item it matches; the earliest matched
  closure gives ``closed_at``;
* the latest manual close (by edit timestamp) wins over story closures.

``derive`` is cached per journal root, keyed by ``(path, mtime_ns, size)`` of
every activity day file, and each file's extracted facts are cached the same
way. Checking that key stats every file, so it is done at most once every
``CACHE_TTL_S`` (2 s) while the mtimes of ``facets/``, its folders and their
``activities/`` folders stay put: a file added, removed or replaced
(``os.replace``, as solstone and ``voiceactors.storage`` write) shows up at the
next call, a file rewritten in place within ``CACHE_TTL_S``. The caches are
guarded by locks: the functions here are called from worker threads.

``close`` is the one write: it appends a ``ledger_close`` edit to the record
that opened the item, through ``voiceactors.storage.update_jsonl`` (flock on
``<file>.lock``, temp file + fsync + ``os.replace``). Its effect is visible at
once: it re-reads that one file and, as a close changes only the state of the
item it names, patches that item in the cached derivation instead of
rebuilding every item. The edit is stamped after the item's latest close
(``stamp_after``), and the file's lock is waited for at most
``lock_timeout_s``. It blocks; the executor runs it in a write thread
(``storage.run_in_write_slot``).
"""

from __future__ import annotations

import bisect
import datetime as _dt
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

from rapidfuzz import fuzz, process

from voiceactors import clock, storage
from voiceactors.journal.facets import enabled_facets, facet_slugs
from voiceactors.journal.file_cache import Stamp, StatCache, stamp_of
from voiceactors.journal.paths import DAY_RE, check_slug, inside, read_jsonl
from voiceactors.logs import get_logger

ACTION_MATCH_THRESHOLD = 78
STATES = ("open", "closed", "dropped")
CLOSE_STATES = ("closed", "dropped")
_FIELD_ORDER = {"commitments": 0, "closures": 1, "edits": 2}
_RESOLUTION_PREFIX = "resolution:"

_log = get_logger(actor="journal")


class SourceRef(NamedTuple):
    """Where an item was seen: a record and the field it was seen in
    (``commitments``, ``closures`` or ``edits``)."""

    facet: str
    day: str          # YYYYMMDD
    activity_id: str
    field: str


@dataclass(frozen=True)
class LedgerItem:
    id: str
    state: str                      # open | closed | dropped
    owner: str
    owner_entity_id: str | None
    counterparty: str | None
    counterparty_entity_id: str | None
    action: str
    when: str | None
    context: str
    opened_at: int                  # ms, created_at of the opening record
    closed_at: int | None           # ms
    resolution: str | None          # from the winning manual close's note
    facet: str                      # facet of the opening record
    sources: tuple[SourceRef, ...]


# --- normalizing and ids --------------------------------------------------------


def normalize(text: object) -> str:
    """Lowercase, trim, collapse whitespace."""
    return " ".join(str(text or "").lower().split())


def item_id(owner_entity_id: str | None, action: str, counterparty_entity_id: str | None) -> str:
    """The ledger id of a commitment (``action`` is normalized here)."""
    raw = f"{owner_entity_id or ''}|{normalize(action)}|{counterparty_entity_id or ''}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def _opt_id(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ("" if value is None else str(value).strip())


def _created_at(record: dict[str, Any]) -> int:
    try:
        return int(record.get("created_at") or 0)
    except (TypeError, ValueError):
        return 0


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def parse_timestamp_ms(value: Any) -> int | None:
    """An edit ``timestamp`` (ISO, ``Z`` allowed; naive = UTC) as epoch ms."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    # integer arithmetic: a float timestamp can land 1 ms low, and close()
    # relies on "latest + 1 ms" sorting after the latest
    return (parsed - _EPOCH) // _dt.timedelta(milliseconds=1)


def resolution_of(note: Any) -> str | None:
    """The value after ``resolution:`` in a close note, if any."""
    if not isinstance(note, str):
        return None
    low = note.lower()
    at = low.find(_RESOLUTION_PREFIX)
    if at < 0:
        return None
    value = note[at + len(_RESOLUTION_PREFIX):].strip().splitlines()
    return value[0].strip() if value and value[0].strip() else None


# --- facts extracted from one file ---------------------------------------------------


@dataclass(frozen=True)
class _Commitment:
    id: str
    order: tuple[int, str, str, str]      # created_at, facet, day, record id
    owner: str
    owner_entity_id: str | None
    counterparty: str | None
    counterparty_entity_id: str | None
    counterparty_norm: str
    action: str
    action_norm: str
    when: str | None
    context: str
    source: SourceRef


@dataclass(frozen=True)
class _Closure:
    order: tuple[int, str, str, str]
    bucket: tuple[Any, ...]
    action_norm: str
    closed_at: int
    source: SourceRef


@dataclass(frozen=True)
class _Manual:
    item_id: str
    order: tuple[int, str, str, str, int]  # timestamp ms, facet, day, record id, edit index
    state: str
    closed_at: int
    resolution: str | None
    source: SourceRef
    source_created_at: int


@dataclass(frozen=True)
class _FileFacts:
    commitments: tuple[_Commitment, ...]
    closures: tuple[_Closure, ...]
    manual: tuple[_Manual, ...]


def _bucket(owner_entity_id: str | None, cp_id: str | None, cp_norm: str) -> tuple[Any, ...]:
    # Items and closures can only match inside one bucket: owner ids equal (or
    # both missing) and counterparty ids equal, or both missing with equal
    # names. Bucketing keeps the fuzzy pass off the full cross product.
    return (owner_entity_id, ("id", cp_id) if cp_id else ("name", cp_norm))


def _manual_from_edit(edit: Any, index: int, facet: str, day: str, rid: str, created: int) -> _Manual | None:
    if not isinstance(edit, dict) or edit.get("fields") != ["ledger_close"]:
        return None
    close = edit.get("ledger_close")
    if not isinstance(close, dict):
        return None
    target, state = close.get("item_id"), close.get("as_state")
    if not isinstance(target, str) or not target or state not in CLOSE_STATES:
        return None
    ts = parse_timestamp_ms(edit.get("timestamp"))
    ts = created if ts is None else ts
    return _Manual(
        item_id=target,
        order=(ts, facet, day, rid, index),
        state=state,
        closed_at=ts,
        resolution=resolution_of(edit.get("note")),
        source=SourceRef(facet, day, rid, "edits"),
        source_created_at=created,
    )


def _record_facts(
    record: dict[str, Any], facet: str, day: str
) -> tuple[list[_Commitment], list[_Closure], list[_Manual]]:
    rid = _text(record.get("id"))
    commitments: list[_Commitment] = []
    closures: list[_Closure] = []
    manual: list[_Manual] = []
    if not rid:
        return commitments, closures, manual
    created = _created_at(record)
    order = (created, facet, day, rid)
    for raw in record.get("commitments") or ():
        if not isinstance(raw, dict):
            continue
        owner, action = _text(raw.get("owner")), _text(raw.get("action"))
        if not owner or not action:
            continue
        owner_id = _opt_id(raw.get("owner_entity_id"))
        cp_id = _opt_id(raw.get("counterparty_entity_id"))
        counterparty = _text(raw.get("counterparty")) or None
        commitments.append(_Commitment(
            id=item_id(owner_id, action, cp_id),
            order=order,
            owner=owner,
            owner_entity_id=owner_id,
            counterparty=counterparty,
            counterparty_entity_id=cp_id,
            counterparty_norm=normalize(counterparty),
            action=action,
            action_norm=normalize(action),
            when=_text(raw.get("when")) or None,
            context=_text(raw.get("context")),
            source=SourceRef(facet, day, rid, "commitments"),
        ))
    for raw in record.get("closures") or ():
        if not isinstance(raw, dict):
            continue
        action = normalize(raw.get("action"))
        if not action:
            continue
        cp_id = _opt_id(raw.get("counterparty_entity_id"))
        closures.append(_Closure(
            order=order,
            bucket=_bucket(_opt_id(raw.get("owner_entity_id")), cp_id, normalize(raw.get("counterparty"))),
            action_norm=action,
            closed_at=created,
            source=SourceRef(facet, day, rid, "closures"),
        ))
    edits = record.get("edits")
    if isinstance(edits, list):
        for index, edit in enumerate(edits):
            m = _manual_from_edit(edit, index, facet, day, rid, created)
            if m is not None:
                manual.append(m)
    return commitments, closures, manual


def _file_facts(path: Path, facet: str, day: str) -> _FileFacts:
    commitments: list[_Commitment] = []
    closures: list[_Closure] = []
    manual: list[_Manual] = []
    for record in read_jsonl(path):
        c, cl, m = _record_facts(record, facet, day)
        commitments += c
        closures += cl
        manual += m
    return _FileFacts(tuple(commitments), tuple(closures), tuple(manual))


# --- building items ----------------------------------------------------------------


@dataclass
class _Derived:
    items: dict[str, LedgerItem] = field(default_factory=dict)       # opening order
    open_order: list[LedgerItem] = field(default_factory=list)       # oldest first
    closed_order: list[LedgerItem] = field(default_factory=list)     # closed_at desc
    opening: dict[str, SourceRef] = field(default_factory=dict)
    manual: dict[str, list[_Manual]] = field(default_factory=dict)
    # what an item is made of besides its manual closes, kept so that a close
    # (which only adds a manual close) can rebuild that one item
    firsts: dict[str, _Commitment] = field(default_factory=dict)
    base_refs: dict[str, list[tuple[tuple[Any, ...], SourceRef]]] = field(default_factory=dict)
    story: dict[str, list[_Closure]] = field(default_factory=dict)


def _source_key(ref: SourceRef, created: int) -> tuple[int, str, str, str, int]:
    return (created, ref.facet, ref.day, ref.activity_id, _FIELD_ORDER.get(ref.field, 9))


def _sorted_tokens(text: str) -> str:
    return " ".join(sorted(text.split()))


def _match_closures(firsts: list[_Commitment], closures: list[_Closure]) -> dict[str, list[_Closure]]:
    """Pair items (in opening order) with the unconsumed closures they match."""
    closures = sorted(closures, key=lambda c: c.order)
    buckets: dict[tuple[Any, ...], list[_Closure]] = {}
    for closure in closures:
        buckets.setdefault(closure.bucket, []).append(closure)
    # token_sort_ratio(a, b) is ratio() of the token-sorted strings: sort each
    # closure's tokens once instead of once per comparison.
    choices = {key: [_sorted_tokens(cl.action_norm) for cl in pool] for key, pool in buckets.items()}
    consumed: dict[tuple[Any, ...], set[int]] = {}
    matched: dict[str, list[_Closure]] = {}
    for c in firsts:
        key = _bucket(c.owner_entity_id, c.counterparty_entity_id, c.counterparty_norm)
        pool = buckets.get(key)
        if not pool:
            continue
        used = consumed.setdefault(key, set())
        hits = process.extract(
            _sorted_tokens(c.action_norm), choices[key], scorer=fuzz.ratio,
            processor=None, score_cutoff=ACTION_MATCH_THRESHOLD, limit=None,
        )
        indexes = sorted(i for _choice, _score, i in hits if i not in used)
        if indexes:
            used.update(indexes)
            matched[c.id] = [pool[i] for i in indexes]
    return matched


def _make_item(c: _Commitment, base_refs: list[tuple[tuple[Any, ...], SourceRef]], story: list[_Closure],
               manuals: list[_Manual]) -> LedgerItem:
    """One item from its first commitment, the refs of its commitments and
    story closures (in that order), its story closures and its manual closes."""
    refs = base_refs + [(_source_key(m.source, m.source_created_at), m.source) for m in manuals]
    state, closed_at, resolution = "open", None, None
    if manuals:
        last = max(manuals, key=lambda m: m.order)
        state, closed_at, resolution = last.state, last.closed_at, last.resolution
    elif story:
        state, closed_at = "closed", story[0].closed_at
    return LedgerItem(
        id=c.id, state=state, owner=c.owner, owner_entity_id=c.owner_entity_id,
        counterparty=c.counterparty, counterparty_entity_id=c.counterparty_entity_id,
        action=c.action, when=c.when, context=c.context, opened_at=c.order[0],
        closed_at=closed_at, resolution=resolution, facet=c.source.facet,
        sources=tuple(ref for _key, ref in sorted(refs, key=lambda r: r[0])),
    )


def _manual_by_item(facts: Iterable[_FileFacts]) -> dict[str, list[_Manual]]:
    manual: dict[str, list[_Manual]] = {}
    for ff in facts:
        for m in ff.manual:
            manual.setdefault(m.item_id, []).append(m)
    return manual


def _open_key(item: LedgerItem) -> tuple[int, str]:
    return (item.opened_at, item.id)


def _closed_key(item: LedgerItem) -> tuple[int, str]:
    return (item.closed_at or 0, item.id)


def _build(facts: Iterable[_FileFacts]) -> _Derived:
    facts = list(facts)
    firsts: dict[str, _Commitment] = {}
    sources: dict[str, list[tuple[tuple[Any, ...], SourceRef]]] = {}
    closures: list[_Closure] = []
    for ff in facts:
        for c in ff.commitments:
            sources.setdefault(c.id, []).append((_source_key(c.source, c.order[0]), c.source))
            if c.id not in firsts or c.order < firsts[c.id].order:
                firsts[c.id] = c
        closures.extend(ff.closures)
    manual = _manual_by_item(facts)

    ordered = sorted(firsts.values(), key=lambda c: (c.order, c.id))
    matched = _match_closures(ordered, closures)
    out = _Derived(manual=manual, story=matched)
    for c in ordered:
        story = matched.get(c.id, [])
        base = sources[c.id] + [(_source_key(cl.source, cl.closed_at), cl.source) for cl in story]
        out.items[c.id] = _make_item(c, base, story, manual.get(c.id, []))
        out.opening[c.id] = c.source
        out.firsts[c.id] = c
        out.base_refs[c.id] = base
    out.open_order = [i for i in out.items.values() if i.state == "open"]
    out.open_order.sort(key=_open_key)
    out.closed_order = [i for i in out.items.values() if i.state != "open"]
    out.closed_order.sort(key=_closed_key, reverse=True)
    return out


def _desc_index(items: list[LedgerItem], key: tuple[int, str]) -> int:
    """Where ``key`` goes in ``items`` sorted by ``_closed_key`` descending."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if _closed_key(items[mid]) > key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _replace_item(d: _Derived, new: LedgerItem) -> None:
    """Swap one item in ``d`` (same id), keeping both order lists sorted exactly
    as ``_build`` sorts them (their keys end with the id, so they are unique)."""
    old = d.items[new.id]
    d.items[new.id] = new         # same key: its place in opening order is kept
    if old.state == "open":
        at = bisect.bisect_left(d.open_order, _open_key(old), key=_open_key)
        del d.open_order[at]
    else:
        at = _desc_index(d.closed_order, _closed_key(old))
        del d.closed_order[at]
    if new.state == "open":
        bisect.insort(d.open_order, new, key=_open_key)
    else:
        d.closed_order.insert(_desc_index(d.closed_order, _closed_key(new)), new)


# --- the per-root cache --------------------------------------------------------------

#: How long a validated derivation is trusted while no activity folder's mtime
#: changed. Files replaced or added (solstone and ``storage`` write through
#: ``os.replace``) change their folder's mtime and show up at the next call; a
#: file rewritten in place does not, so it shows up within this many seconds.
CACHE_TTL_S = 2.0
#: The cache's clock (seconds, monotonic). Module level so tests can pass in
#: one they control.
monotonic: Callable[[], float] = time.monotonic

_Stamps = dict[str, Stamp]                     # path -> (mtime_ns, size)
_DirSig = tuple[Any, ...]


class _RootCache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stamps: _Stamps | None = None    # what ``derived`` was built from
        self.derived: _Derived | None = None
        # each activity file's facts by its stamp; in scan (path) order, which
        # is the order ``_build`` consumes them in
        self.files: StatCache[_FileFacts] = StatCache()
        self.dir_sig: _DirSig | None = None   # folder mtimes at the last full check
        self.checked: float | None = None     # ``monotonic()`` at the last full check


_roots_lock = threading.Lock()
_roots: dict[str, _RootCache] = {}


def _root_cache(root: Path) -> _RootCache:
    key = str(Path(root).resolve())
    with _roots_lock:
        cache = _roots.get(key)
        if cache is None:
            cache = _roots[key] = _RootCache()
        return cache


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _dir_sig(root: Path) -> _DirSig:
    """mtimes of ``facets/``, of every folder in it and of its ``activities/``:
    what changes when a facet, a ``facet.json`` or an activity file appears,
    disappears or is replaced (a few stats, not one per file)."""
    top = os.path.join(root, "facets")
    try:
        with os.scandir(top) as it:
            names = sorted(entry.name for entry in it)
    except OSError:
        return (None,)
    return (_mtime(top), *(
        (name, _mtime(os.path.join(top, name)), _mtime(os.path.join(top, name, "activities")))
        for name in names))


def _facts_when_asked(path: str, facet: str, day: str) -> Callable[[], _FileFacts]:
    """The loader of one file's facts for the cache, which calls it on a miss only."""
    return lambda: _file_facts(Path(path), facet, day)


def _scan(root: Path) -> list[tuple[str, str, str, int, int]]:
    """``(path, facet, day, mtime_ns, size)`` of every activity day file of
    every facet (stat only), sorted by path."""
    out = []
    for facet in facet_slugs(root):
        try:
            folder = inside(root, "facets", facet, "activities")
        except ValueError:  # a facet symlinked outside the journal
            continue
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            name = entry.name
            if not (name.endswith(".jsonl") and DAY_RE.fullmatch(name[:-6])):
                continue
            try:
                if not entry.is_file():
                    continue
                st = entry.stat()
            except FileNotFoundError:
                continue
            out.append((entry.path, facet, name[:-6], st.st_mtime_ns, st.st_size))
    out.sort()
    return out


def _derived(root: Path) -> _Derived:
    """The cached derivation of ``root``, checked first.

    The full check stats every activity file. It is skipped while no folder
    mtime (``_dir_sig``) changed and the last full check is younger than
    ``CACHE_TTL_S``. Only files whose ``(mtime_ns, size)`` changed are re-read;
    any change rebuilds the items from the per-file facts."""
    root = Path(root)
    cache = _root_cache(root)
    with cache.lock:
        now = monotonic()
        sig = _dir_sig(root)          # before the scan: a change during it shows next time
        if (cache.derived is not None and cache.checked is not None and sig == cache.dir_sig
                and now - cache.checked < CACHE_TTL_S):
            return cache.derived
        files = _scan(root)
        stamps = {p: (m, s) for p, _f, _d, m, s in files}
        if cache.derived is None or cache.stamps != stamps:
            facts = [cache.files.get(path, (mtime, size), _facts_when_asked(path, facet, day))
                     for path, facet, day, mtime, size in files]
            cache.files.keep_only(stamps)             # files gone are dropped; scan order
            cache.derived = _build(facts)
            cache.stamps = stamps
        cache.dir_sig, cache.checked = sig, now
        return cache.derived


def _invalidate(root: Path, path: Path | None = None) -> None:
    cache = _root_cache(root)
    with cache.lock:
        cache.stamps = None
        cache.derived = None
        cache.checked = None
        if path is not None:
            cache.files.pop(str(path))


def _apply_write(root: Path, path: Path, facet: str, day: str) -> None:
    """Bring the cache up to date after ``close`` rewrote ``path``.

    A close only adds manual closes, which change the state of the items they
    name and nothing else. So when the file's commitments and story closures
    are what the cache has, the derivation is patched item by item (the result
    is exactly what a rebuild gives); otherwise (someone else changed the file
    too) it is dropped and the next call rebuilds it. Either way the next call
    does a full check, which also catches other writers."""
    cache = _root_cache(root)
    key = str(path)
    with cache.lock:
        cache.checked = None
        d, known = cache.derived, cache.files.entry(key)
        if d is None or known is None or cache.stamps is None or key not in cache.stamps:
            cache.derived = cache.stamps = None
            cache.files.pop(key)
            return
        try:
            st = os.stat(path)        # before reading: a later change shows as a new stamp
        except FileNotFoundError:
            cache.derived = cache.stamps = None
            cache.files.pop(key)
            return
        facts = _file_facts(path, facet, day)
        old = known[1]
        cache.files.put(key, stamp_of(st), facts)   # same key: its order is kept
        if facts.commitments != old.commitments or facts.closures != old.closures:
            cache.derived = cache.stamps = None
            return
        cache.stamps[key] = stamp_of(st)
        if facts.manual == old.manual:
            return
        # copy on write: callers iterate the derivation they got without the lock
        d = cache.derived = replace(
            d, items=dict(d.items), open_order=list(d.open_order), closed_order=list(d.closed_order),
            manual=_manual_by_item(cache.files.values()))
        for item_id in sorted({m.item_id for m in (*old.manual, *facts.manual)}):
            if item_id not in d.items:
                continue
            item = _make_item(d.firsts[item_id], d.base_refs[item_id], d.story.get(item_id, []),
                              d.manual.get(item_id, []))
            if item != d.items[item_id]:
                _replace_item(d, item)


# --- public surface ------------------------------------------------------------------


def derive(root: Path) -> list[LedgerItem]:
    """Every ledger item of every facet, in opening order. Cached (see the
    module docstring): an unchanged journal costs a few folder stats."""
    return list(_derived(root).items.values())


def get_item(root: Path, item_id: str) -> LedgerItem | None:
    """The item with id ``item_id``, or None."""
    return _derived(root).items.get(item_id) if isinstance(item_id, str) else None


def list_items(
    root: Path,
    state: str | None = None,
    facets: Iterable[str] | None = None,
    top: int | None = 20,
) -> list[LedgerItem]:
    """Items filtered by ``state`` (None = all) and by the facet of their
    opening record (``facets`` None = the enabled facets), at most ``top``
    (None = no cap). Open items come oldest first; closed and dropped items
    most recently closed first; with ``state=None`` the open ones come first.
    ValueError for an unknown state; InvalidName for a malformed facet."""
    if state is not None and state not in STATES:
        raise ValueError(f"unknown state: {state!r}")
    if facets is None:
        allowed = {f.slug for f in enabled_facets(root)}
    else:
        allowed = {check_slug(f) for f in ([facets] if isinstance(facets, str) else facets)}
    cap = None if top is None else max(0, int(top))
    d = _derived(root)
    if state == "open":
        pool: Iterable[LedgerItem] = d.open_order
    elif state is None:
        pool = [*d.open_order, *d.closed_order]
    else:
        pool = (i for i in d.closed_order if i.state == state)
    out: list[LedgerItem] = []
    for item in pool:
        if cap is not None and len(out) >= cap:
            break
        if item.facet in allowed:
            out.append(item)
    return out


def stamp_after(latest_ms: int | None) -> str:
    """The timestamp for a new manual close: now (whole seconds, UTC), or
    ``latest_ms + 1`` ms when the latest close of the item is not older than
    that (another writer's clock is ahead of ours): the latest close wins, so
    a close stamped before it would change nothing."""
    now = clock.journal_now().replace(microsecond=0)
    if latest_ms is None or (now - _EPOCH) // _dt.timedelta(milliseconds=1) > latest_ms:
        return now.strftime("%Y-%m-%dT%H:%M:%SZ")
    after = _EPOCH + _dt.timedelta(milliseconds=latest_ms + 1)
    return after.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _day_file(root: Path, ref: SourceRef) -> Path:
    return inside(root, "facets", check_slug(ref.facet), "activities", f"{ref.day}.jsonl")


def opening_file(root: Path, item_id: str) -> Path:
    """The activity file ``close`` writes for ``item_id``: the day file of the
    record that opened the item (its lock, ``<file>.lock``, is the one a close
    waits for). KeyError for an unknown item."""
    root = Path(root)
    d = _derived(root)
    if not isinstance(item_id, str) or item_id not in d.items:
        raise KeyError(item_id)
    return _day_file(root, d.opening[item_id])


def close(root: Path, item_id: str, as_state: str, note: str, actor: str = "voice", *,
          lock_timeout_s: float | None = storage.DEFAULT_LOCK_TIMEOUT_S) -> LedgerItem:
    """Close (``as_state="closed"``) or drop an item by appending a
    ``ledger_close`` edit to the record that opened it; returns the item as
    derived afterwards (callers check its state: a close in a file this one
    did not see can still outrank ours). Idempotent: when the latest manual
    close of the item already has ``as_state``, nothing is written. The edit
    is stamped after every close of the item seen under the lock
    (``stamp_after``). KeyError for an unknown item (or when its record
    vanished); ValueError for a bad ``as_state``; ``storage.LockTimeout``
    when the day file's lock is not free within ``lock_timeout_s`` (nothing
    written).

    Blocking and not interruptible midway: the file is replaced atomically or
    not at all, so a crash leaves the old file intact."""
    if as_state not in CLOSE_STATES:
        raise ValueError(f"as_state must be one of {CLOSE_STATES}, not {as_state!r}")
    if not isinstance(note, str):
        raise ValueError("note must be a string")
    root = Path(root)
    d = _derived(root)
    if not isinstance(item_id, str) or item_id not in d.items:
        raise KeyError(item_id)
    opening = d.opening[item_id]
    path = _day_file(root, opening)
    elsewhere = [m for m in d.manual.get(item_id, ()) if (m.source.facet, m.source.day) != (opening.facet, opening.day)]
    outcome = {"status": "missing"}

    def change(rows: list[Any]) -> bool:
        # Re-read under the lock: another writer may have closed it meanwhile.
        target = None
        existing = list(elsewhere)
        for row in rows:
            if not isinstance(row, dict):
                continue
            commitments, _closures, manual = _record_facts(row, opening.facet, opening.day)
            existing += [m for m in manual if m.item_id == item_id]
            if target is None and _text(row.get("id")) == opening.activity_id and any(
                c.id == item_id for c in commitments
            ):
                target = row
        if target is None:
            return False
        if existing and max(existing, key=lambda m: m.order).state == as_state:
            outcome["status"] = "unchanged"
            return False
        edits = target.setdefault("edits", [])
        if not isinstance(edits, list):
            outcome["status"] = "bad_edits"
            return False
        edits.append({
            "timestamp": stamp_after(max((m.order[0] for m in existing), default=None)),
            "actor": actor,
            "fields": ["ledger_close"],
            "note": note,
            "ledger_close": {"item_id": item_id, "as_state": as_state},
        })
        outcome["status"] = "written"
        return True

    storage.update_jsonl(path, change, lock_timeout_s=lock_timeout_s)
    _log.info("journal.ledger_close", item_id=item_id, outcome=outcome["status"], facet=opening.facet)
    if outcome["status"] == "missing":
        _invalidate(root, path)
        raise KeyError(item_id)
    if outcome["status"] == "bad_edits":
        raise ValueError(f"record {opening.activity_id} has a non-list edits field")
    if outcome["status"] == "written":
        _apply_write(root, path, opening.facet, opening.day)
    item = get_item(root, item_id)
    if item is None:  # pragma: no cover - the record we just wrote holds it
        raise KeyError(item_id)
    return item
