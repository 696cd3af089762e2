#!/usr/bin/env python3
"""In-process cost of one FileSource poll over 5,000 idle files, for the package found under PKG_ROOT
(default: this checkout's ``exporter/``) — run it once more against an older tree to compare, e.g. the
code before issue 14:

    mkdir -p /tmp/before && git archive fbb338a exporter/omniwatch | tar -x -C /tmp/before
    .venv/bin/python benchmarks/tail_idle_poll.py /tmp/before/exporter
    .venv/bin/python benchmarks/tail_idle_poll.py

Prints the first pass (5,000 one-line files ingested), the steady idle poll (after 70 polls, so files
idle long enough to be looked at less often where the code does that) and the descriptors it holds."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1] / "exporter"))

from omniwatch.model import RunStore  # noqa: E402
from omniwatch.sources.files import FileSource  # noqa: E402


def main(n: int = 5000) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for i in range(n):
            p = root / f"proj{i // 100:03d}"
            p.mkdir(exist_ok=True)
            (p / f"exp{i % 100:03d}.jsonl").write_bytes(b'{"step":1,"data":{"timing_s/step":1.0}}\n')
        src = FileSource(RunStore(max_runs=n + 10), [str(root)], "jsonl")
        fd0 = len(os.listdir("/proc/self/fd"))
        t = time.process_time()
        src.poll_once()
        first = time.process_time() - t
        for _ in range(70):
            src.poll_once()
        t = time.process_time()
        for _ in range(40):
            src.poll_once()
        idle = (time.process_time() - t) / 40
        fds = len(os.listdir("/proc/self/fd")) - fd0
        print(f"{sys.modules['omniwatch'].__file__}: first pass {first * 1000:.0f} ms, idle poll "
              f"{idle * 1000:.1f} ms CPU, {fds} descriptors held for {n} files")


if __name__ == "__main__":
    main()
