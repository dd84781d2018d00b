"""A server child process's stderr, read while the test talks to it."""

from __future__ import annotations

import subprocess
import threading


def pump_stderr(child: subprocess.Popen[str], ready_event: str) -> tuple[list[str], threading.Event]:
    """Collect ``child``'s stderr lines in a daemon thread (a full pipe would
    stall the child). The event is set once a line carries ``ready_event``
    as its JSON event name (e.g. ``server.serving``)."""
    lines: list[str] = []
    ready = threading.Event()
    marker = f'"{ready_event}"'
    assert child.stderr is not None

    def pump() -> None:
        for line in child.stderr:
            lines.append(line)
            if marker in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    return lines, ready
