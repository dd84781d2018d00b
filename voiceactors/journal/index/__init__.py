"""Our full-text index over a journal: discovery, extraction, incremental build.

The index is an SQLite FTS5 database with solstone's own ``chunks`` schema
(``content`` indexed; ``path, day, facet, agent, stream, idx, time_bucket``
UNINDEXED) plus ``files(path PRIMARY KEY, mtime)``. It lives in
``<state_dir>/search/<sha1 of the resolved journal path>.sqlite`` and never
inside the journal.

A *unit* is what one ``files`` row tracks and what ``chunks.path`` names:

* a segment (``YYYYMMDD/<stream>/HHMMSS_LEN``): its ``talents/*.md`` joined;
* a day talent (``YYYYMMDD/talents/<name>.md``, agent = the file stem);
* an entity (``entity_search:<id>``): identity, facet descriptions, observations;
* a facet file (``facets/<f>/activities|events|todos/YYYYMMDD.jsonl``,
  ``facets/<f>/news/YYYYMMDD.md``).

``files.mtime`` is the unit's signature: the file's ``st_mtime_ns`` for a
single file, and a 63-bit hash of every contributing file's name, mtime and
size for a multi-file unit (so a removed contributor also counts as a change).
Each unit's chunks get rowids ``files.rowid << 16 | idx``, so replacing or
removing a unit is an indexed rowid-range delete rather than a table scan.
(So never VACUUM this database: it may renumber ``files`` rowids. It is a
cache; delete it to start over.)

Everything here is synchronous and blocking; run it in a worker thread.
``ensure_index`` builds in a child process (``refresh_child``): the first
build (the caller waits for it, blocked in the kernel) and the periodic
refresh (in the background), so a walk over a big journal never holds the
server's GIL. ``build_index`` builds in the calling process.

One module per concern:

* ``locations`` — where the index lives, its schema, whether a build is whole;
* ``discovery`` — the journal's units and their signatures (a walk + stat);
* ``extraction`` — a unit's text, split into chunks;
* ``build`` — the incremental build, under its thread and file locks;
* ``children`` — the build/refresh child processes and ``ensure_index``.
"""

from voiceactors.journal.index.build import IndexStats, build_index
from voiceactors.journal.index.children import (
    REFRESH_TIMEOUT_S,
    ensure_index,
    join_refresh,
    refresh_child,
    running_refresh,
)
from voiceactors.journal.index.locations import connect, index_path, is_ready, solstone_index

__all__ = [
    "REFRESH_TIMEOUT_S", "IndexStats", "build_index", "connect", "ensure_index", "index_path", "is_ready",
    "join_refresh", "refresh_child", "running_refresh", "solstone_index",
]
