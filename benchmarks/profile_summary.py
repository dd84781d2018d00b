"""Summarise a py-spy ``--format raw`` (collapsed stacks) profile as text.

The sideband benchmarks take ``--py-spy SECONDS``: they sample the peer
process with ``py-spy record --nonblocking --format raw`` while the workload
runs and write ``peer.pyspy.txt`` into the run folder. This prints, for such
a file, the functions with the most *own* samples (where the CPU is spent),
the functions with the most *inclusive* samples (what that time is spent
for), and own samples per source file.

Run::

    .venv/bin/python -m benchmarks.profile_summary /tmp/voiceactors-bench/runs/<run>/peer.pyspy.txt [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def _short(path: str) -> str:
    for marker in ("site-packages/", "/voiceactors/", "/benchmarks/", "/lib/python3"):
        i = path.find(marker)
        if i >= 0:
            return path[i + (len(marker) if marker == "site-packages/" else 1):]
    return path


def _key(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return m.group("func"), _short(m.group("file"))


def summarise(text: str, top: int = 25) -> str:
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    incl: collections.Counter[tuple[str, str]] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_key(f) for f in stack.split(";") if f]
        # py-spy puts the thread name first: keep only real frames
        frames = [f for f in frames if f[1]]
        if not frames:
            continue
        own[frames[-1]] += n
        files[frames[-1][1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return "no samples"

    def table(counter: collections.Counter[tuple[str, str]], title: str) -> list[str]:
        rows = [f"{title} (of {total} samples)"]
        for (func, file), n in counter.most_common(top):
            rows.append(f"  {100 * n / total:5.1f}%  {func}  [{file}]")
        return rows

    out = table(own, "own time")
    out += table(incl, "inclusive time")
    out.append(f"own time by file (of {total} samples)")
    out += [f"  {100 * n / total:5.1f}%  {file}" for file, n in files.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    print(summarise(Path(args.path).read_text(errors="replace"), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
