"""The journal readers' stat-keyed cache, over real files."""

from __future__ import annotations

import os

from voiceactors.journal.file_cache import StatCache, file_stamp


def test_a_value_is_reused_until_the_file_changes(tmp_path):
    path = tmp_path / "20260301.jsonl"
    path.write_text('{"a": 1}\n')
    cache: StatCache[str] = StatCache()
    loads = []

    def load():
        loads.append(1)
        return path.read_text()

    assert cache.get(str(path), file_stamp(path), load) == '{"a": 1}\n'
    assert cache.get(str(path), file_stamp(path), load) == '{"a": 1}\n'
    assert len(loads) == 1                          # same stamp: not read again
    path.write_text('{"a": 1}\n{"b": 2}\n')         # new size (and mtime)
    assert cache.get(str(path), file_stamp(path), load) == '{"a": 1}\n{"b": 2}\n'
    assert len(loads) == 2


def test_same_size_rewrite_with_a_new_mtime_is_seen(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("one")
    cache: StatCache[str] = StatCache()
    assert cache.get(str(path), file_stamp(path), path.read_text) == "one"
    path.write_text("two")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache.get(str(path), file_stamp(path), path.read_text) == "two"


def test_missing_file_has_no_stamp(tmp_path):
    assert file_stamp(tmp_path / "absent.jsonl") is None


def test_keep_only_drops_the_rest_and_takes_the_given_order(tmp_path):
    cache: StatCache[str] = StatCache()
    for name in ("a", "b", "c"):
        cache.put(name, (0, 0), name.upper())
    cache.keep_only(["c", "a", "gone"])
    assert cache.values() == ["C", "A"]
    assert cache.entry("b") is None
    cache.put("a", (1, 1), "A2")                    # an existing path keeps its place
    assert cache.values() == ["C", "A2"]
