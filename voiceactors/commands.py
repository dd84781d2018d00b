"""What the server's commands share (``serve``, the ``serve --workers N``
parent, ``mcp``): their exit codes, the state folder's lock, the console's
address. Below ``server`` and ``workers`` alike, so that neither imports the
other for them (``serve --workers N`` is ``server`` handing over to
``workers``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from voiceactors import storage

EXIT_USAGE = 2
EXIT_RUNTIME_FAILED = 3       # ``serve``: the voice runtime failed and the server stopped for it
EXIT_INTERRUPTED = 130


def console_url(binds: list[str]) -> str:
    """The console's address for the first bound URL (``http://127.0.0.1:8765/``)."""
    return binds[0].rstrip("/") + "/"


# --- one server per state directory -----------------------------------------------

LOCK_FILE = "server.lock"


class StateDirInUse(RuntimeError):
    """Another server holds the state directory's lock."""


@contextlib.contextmanager
def state_dir_lock(state_dir: Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``<state_dir>/server.lock`` for the
    block: two servers writing one state dir (call records, the brain's
    cache, the search index) would corrupt each other. The lock goes with
    the process, however it ends. Raises StateDirInUse when it is held."""
    state_dir = Path(state_dir)
    storage.private_folder(state_dir)
    path = state_dir / LOCK_FILE
    fd, _created = storage.open_private(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise StateDirInUse(f"another server is using the state folder {state_dir} (pid {holder}); "
                                "stop it or choose another --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield path
    finally:
        os.close(fd)          # releases the lock
