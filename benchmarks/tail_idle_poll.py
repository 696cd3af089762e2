#!/usr/bin/env python3
"""In-process cost of one FileSource poll over 5,000 idle files, for the package found under PKG_ROOT
(default: this checkout's ``exporter/``) — run it once more against an older tree to compare, e.g. the
code before issue 14:

    mkdir -p /tmp/before && git archive fbb338a exporter/omniwatch | tar -x -C /tmp/before
    .venv/bin/python benchmarks/tail_idle_poll.py /tmp/before/exporter
    .venv/bin/python benchmarks/tail_idle_poll.py

Prints the first pass (5,000 one-line files ingested), the steady idle poll (after 70 polls, so files
idle long enough to be looked at less often where the code does that) and the descriptors it holds
(``--json``: as one JSON object). ``benchmarks/run.py --only tail`` runs both trees, each in a fresh
interpreter, and records them in results.json (:func:`compare`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_REV = "fbb338a"  # the last commit before issue 14's descriptor pool


def measure(n: int = 5000) -> dict:
    from omniwatch.core.model import RunStore
    from omniwatch.sources.files import FileSource
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
    return {"package": sys.modules["omniwatch"].__file__, "files": n, "first_pass_cpu_ms": round(first * 1000, 1),
            "idle_poll_cpu_ms": round(idle * 1000, 2), "descriptors": fds}


def _child(pkg_root: Path, n: int) -> dict:
    r = subprocess.run([sys.executable, __file__, str(pkg_root), "--json", "--files", str(n)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"tail_idle_poll.py {pkg_root} failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out.pop("package", None)  # a temporary path
    return out


def compare(n: int = 5000, rev: str = BEFORE_REV) -> dict:
    """This checkout's ``exporter/`` against ``git archive REV``'s, one after the other, same machine."""
    with tempfile.TemporaryDirectory() as d:
        tar = Path(d) / "before.tar"
        with open(tar, "wb") as f:
            r = subprocess.run(["git", "-C", str(REPO), "archive", rev, "exporter/omniwatch"], stdout=f,
                               stderr=subprocess.PIPE)
        if r.returncode:
            return {"status": "n/a", "why": f"git archive {rev}: {r.stderr.decode()[-300:]}"}
        with tarfile.open(tar) as t:
            t.extractall(d, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(d)
        before = _child(Path(d) / "exporter", n)
    now = _child(REPO / "exporter", n)
    return {"status": "ok", "before_rev": rev, "now": now, "before": before,
            "idle_poll_ratio": round(now["idle_poll_cpu_ms"] / max(before["idle_poll_cpu_ms"], 1e-9), 3)}


def main(argv: list[str]) -> None:
    n = int(argv[argv.index("--files") + 1]) if "--files" in argv else 5000
    r = measure(n)
    if "--json" in argv:
        print(json.dumps(r))
    else:
        print(f"{r['package']}: first pass {r['first_pass_cpu_ms']:.0f} ms, idle poll {r['idle_poll_cpu_ms']:.1f} ms "
              f"CPU, {r['descriptors']} descriptors held for {n} files")


if __name__ == "__main__":
    args = sys.argv[1:]
    pos = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--files")]
    sys.path.insert(0, pos[0] if pos else str(REPO / "exporter"))
    main(args)
