"""The journal's indexable units and their signatures: a walk and a stat, no reads."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from voiceactors import safe_text
from voiceactors.journal.paths import DAY_RE, SEGMENT_RE, SLUG_RE, STREAM_RE

_SKIP_DAY_CHILDREN = {"health", "indexer", "talents"}
FACET_KINDS = {"activities": ".jsonl", "events": ".jsonl", "todos": ".jsonl", "news": ".md"}


@dataclass(frozen=True)
class Unit:
    key: str                  # chunks.path / files.path
    kind: str                 # segment | day_talent | entity | activities | events | todos | news
    files: tuple[Path, ...]
    signature: int
    day: str = ""             # YYYYMMDD or ""
    facet: str = ""
    stream: str = ""
    primary: Path | None = None   # an entity's identity file (entities/<id>/entity.json)


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _stat_sig(entries: list[os.DirEntry[str]]) -> int | None:
    """Signature of a set of files (None when none can be stat'ed)."""
    parts, mtime = [], 0
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            continue
        mtime = st.st_mtime_ns
        parts.append(f"{entry.path}\0{st.st_mtime_ns}\0{st.st_size}")
    if not parts:
        return None
    if len(parts) == 1 and len(entries) == 1:
        return mtime
    # a name's undecodable bytes are surrogates here: hashed as the bytes they were
    digest = hashlib.sha1("\n".join(parts).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _day_root(root: Path) -> Path:
    chronicle = root / "chronicle"
    return chronicle if chronicle.is_dir() else root


def _md_files(folder: Path) -> list[os.DirEntry[str]]:
    return [e for e in _scandir(folder) if e.name.endswith(".md") and _is_file(e)]


def _segment_units(day: str, day_dir: Path) -> Iterator[Unit]:
    for child in _scandir(day_dir):
        if not _is_dir(child) or child.name in _SKIP_DAY_CHILDREN or child.name.startswith("."):
            continue
        if SEGMENT_RE.fullmatch(child.name):       # a segment directly under the day: stream default
            candidates = [(child, "default", f"{day}/{child.name}")]
        elif STREAM_RE.fullmatch(child.name):
            candidates = [(seg, child.name, f"{day}/{child.name}/{seg.name}")
                          for seg in _scandir(Path(child.path))
                          if SEGMENT_RE.fullmatch(seg.name) and _is_dir(seg)]
        else:
            continue
        for seg, stream, key in candidates:
            talents = _md_files(Path(seg.path) / "talents")
            sig = _stat_sig(talents)
            if sig is not None:
                yield Unit(key, "segment", tuple(Path(e.path) for e in talents), sig, day=day, stream=stream)


def _day_units(root: Path) -> Iterator[Unit]:
    for day_entry in _scandir(_day_root(root)):
        if not DAY_RE.fullmatch(day_entry.name) or not _is_dir(day_entry):
            continue
        day, day_dir = day_entry.name, Path(day_entry.path)
        yield from _segment_units(day, day_dir)
        for talent in _md_files(day_dir / "talents"):
            sig = _stat_sig([talent])
            if sig is not None:
                # the key is stored and shown: a name's undecodable bytes as U+FFFD (safe_text)
                yield Unit(f"{day}/talents/{safe_text.clean_str(talent.name)}", "day_talent", (Path(talent.path),),
                           sig, day=day)


def _entity_units(root: Path) -> Iterator[Unit]:
    files: dict[str, list[os.DirEntry[str]]] = {}
    identities: dict[str, Path] = {}
    for entry in _scandir(root / "entities"):
        if SLUG_RE.fullmatch(entry.name) and _is_dir(entry):
            found = [e for e in _scandir(Path(entry.path)) if e.name == "entity.json" and _is_file(e)]
            files.setdefault(entry.name, []).extend(found)
            if found:
                identities[entry.name] = Path(found[0].path)
    for facet in _scandir(root / "facets"):
        if not _is_dir(facet):
            continue
        for entry in _scandir(Path(facet.path) / "entities"):
            if SLUG_RE.fullmatch(entry.name) and _is_dir(entry):
                files.setdefault(entry.name, []).extend(
                    e for e in _scandir(Path(entry.path))
                    if e.name in ("entity.json", "observations.jsonl") and _is_file(e))
    for entity_id in sorted(files):
        sig = _stat_sig(files[entity_id])
        if sig is not None:
            yield Unit(f"entity_search:{entity_id}", "entity",
                       tuple(Path(e.path) for e in files[entity_id]), sig,
                       primary=identities.get(entity_id))


def _facet_units(root: Path) -> Iterator[Unit]:
    for facet in _scandir(root / "facets"):
        if not SLUG_RE.fullmatch(facet.name) or not _is_dir(facet):
            continue
        for kind, suffix in FACET_KINDS.items():
            for entry in _scandir(Path(facet.path) / kind):
                stem = entry.name[: -len(suffix)] if entry.name.endswith(suffix) else ""
                if not DAY_RE.fullmatch(stem) or not _is_file(entry):
                    continue
                sig = _stat_sig([entry])
                if sig is not None:
                    yield Unit(f"facets/{facet.name}/{kind}/{entry.name}", kind, (Path(entry.path),),
                               sig, day=stem, facet=facet.name)


def discover(root: Path) -> dict[str, Unit]:
    """Every indexable unit of the journal, keyed by its ``chunks.path``."""
    root = Path(root)
    units: dict[str, Unit] = {}
    for source in (_day_units, _entity_units, _facet_units):
        for unit in source(root):
            units[unit.key] = unit
    return units
