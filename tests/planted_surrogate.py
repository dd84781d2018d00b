"""A lone surrogate planted below the boundary, for the tests of a failed
runtime (docs/reliability.md § 14.1): since every text comes in through
``safe_text``, no natural input can fail the runtime any more, so these tests
put one where no input can. ``install()`` wraps coredis's command packer
(the library's, not our code) so that ``MARKER`` in an argument becomes
``"\\udc80"`` before the real packer encodes it; the real packer then raises
the ``UnicodeEncodeError`` it raised for the reproduction's input before
the fix (the shared feed's batch, ``http.runtime_failed``).

In process: ``install()`` (under ``monkeypatch`` via ``install(monkeypatch)``).
In ``serve`` children: ``site_folder(tmp)`` is a folder for ``PYTHONPATH``
whose ``sitecustomize`` installs it at interpreter start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Text that turns into a lone surrogate at the packer (plain ASCII until then).
MARKER = "planted-lone-surrogate"


def _plant(value: Any) -> Any:
    return value.replace(MARKER, "\udc80") if isinstance(value, str) else value


def install(monkeypatch: Any = None) -> None:
    from coredis.connection import _base

    real = _base.Packer

    class PlantingPacker:
        def __init__(self, encoding: str) -> None:
            self._real = real(encoding)

        def encode(self, value: Any) -> Any:
            return self._real.encode(_plant(value))

        def pack_command(self, command: bytes, *args: Any) -> list[bytes]:
            return self._real.pack_command(command, *map(_plant, args))

        def pack_commands(self, commands: list[tuple[Any, ...]]) -> list[bytes]:
            return self._real.pack_commands([tuple(map(_plant, command)) for command in commands])

    if monkeypatch is not None:
        monkeypatch.setattr(_base, "Packer", PlantingPacker)
    else:
        _base.Packer = PlantingPacker   # type: ignore[misc]


def site_folder(tmp: Path) -> Path:
    """A folder with a ``sitecustomize`` that installs the planting packer
    (put it and this file's folder on a child's ``PYTHONPATH``)."""
    folder = tmp / "planted-site"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("import planted_surrogate\nplanted_surrogate.install()\n")
    return folder
