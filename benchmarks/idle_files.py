#!/usr/bin/env python3
"""CPU of ``--watch`` over many idle files (issue 25 item 12): one ``FileSource`` over 1,000 and 100,000
idle one-line files (``<root>/projNNNN/expNNN.jsonl``, 100 per project directory), in-process, for the
package under PKG_ROOT (default: this checkout's ``exporter/``).

The files are read once, then marked idle as the live loop would after 30 s (``unchanged_polls`` set to
``IDLE_AFTER_POLLS``) and, for the second figure, after about 2.5 min (``LONG_IDLE_AFTER_POLLS``): waiting
that long for real would take minutes per size without changing what is measured. Passes run back to back
on a simulated clock at the default 0.5 s poll (a rescan every 2 s of it), so CPU seconds / simulated
seconds is the share of a core the source costs the exporter. ``benchmarks/run.py --only idle`` runs this
checkout and ``git archive 6e55aa9`` (before issue 25), each size in a fresh interpreter:

    .venv/bin/python benchmarks/idle_files.py --files 100000 [PKG_ROOT]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_REV = "6e55aa9"  # the last commit before issue 25's idle-file work
POLL_S = 0.5


def measure(n: int) -> dict:
    from omniwatch.core.model import RunStore
    from omniwatch.sources import files as F
    long_after = getattr(F, "LONG_IDLE_AFTER_POLLS", None)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for i in range(n):
            p = root / f"proj{i // 100:04d}"
            if i % 100 == 0:
                p.mkdir()
            (p / f"exp{i % 100:03d}.jsonl").write_bytes(b'{"step":1,"data":{"timing_s/step":1.0}}\n')
        clock = [time.time() + 10.0]  # past the directories' mtimes (as a watch that started earlier)
        src = F.FileSource(RunStore(), [str(root)], "jsonl", clock=lambda: clock[0])

        def passes(k: int) -> float:
            t = time.process_time()
            for _ in range(k):
                clock[0] += POLL_S
                src.poll_once()
            return (time.process_time() - t) / (k * POLL_S)

        t = time.process_time()
        src.poll_once()
        first = time.process_time() - t
        passes(1)
        for tail in src.tails.values():
            tail.unchanged_polls = F.IDLE_AFTER_POLLS
        idle = passes(48)
        if long_after is not None:
            for tail in src.tails.values():
                tail.unchanged_polls = max(tail.unchanged_polls, long_after)
            long_idle = passes(64)
        else:
            long_idle = passes(64)  # the code before had no second tier: the same state as "idle"
    return {"files": n, "first_pass_cpu_s": round(first, 2), "cpu_share_idle": round(idle, 4),
            "cpu_share_long_idle": round(long_idle, 4)}


WINDOWS = ((0.5, 30.0), (30.0, 90.0), (90.0, 150.0), (150.0, 300.0))   # simulated seconds after the first pass


def timeline(n: int, age_s: float = 0.0) -> dict:
    """The live loop's first 5 minutes, as they are (nothing marked idle by hand): one ``FileSource`` over ``n``
    one-line files last written ``age_s`` before it starts (0: just written, as beside runs that just wrote them;
    86,400: a log root of old runs), passes back to back on a simulated clock at the 0.5 s poll. CPU seconds over
    simulated seconds per window, and the first pass (everything read once)."""
    import os
    from omniwatch.core.model import RunStore
    from omniwatch.sources import files as F
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        t_files = time.time() - age_s
        for i in range(n):
            p = root / f"proj{i // 100:04d}"
            if i % 100 == 0:
                p.mkdir()
            f = p / f"exp{i % 100:03d}.jsonl"
            f.write_bytes(b'{"step":1,"data":{"timing_s/step":1.0}}\n')
            if age_s:
                os.utime(f, (t_files, t_files))
        clock = [time.time() + 1.0]
        src = F.FileSource(RunStore(), [str(root)], "jsonl", clock=lambda: clock[0])
        t = time.process_time()
        src.poll_once()
        out = {"files": n, "age_s": age_s, "first_pass_cpu_s": round(time.process_time() - t, 2), "windows": []}
        sim = 0.0
        for a, b in WINDOWS:
            t = time.process_time()
            k = 0
            while sim < b:
                clock[0] += POLL_S
                sim += POLL_S
                src.poll_once()
                k += 1
            out["windows"].append({"from_s": a, "to_s": b, "cpu_share": round((time.process_time() - t) / (k * POLL_S), 4)})
    return out


def _child(pkg_root: Path, n: int, age_s: float | None = None) -> dict:
    extra = ["--timeline", str(age_s)] if age_s is not None else []
    r = subprocess.run([sys.executable, __file__, str(pkg_root), "--json", "--files", str(n), *extra],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise RuntimeError(f"idle_files.py {pkg_root} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(small: int = 1000, large: int = 100_000, rev: str = BEFORE_REV) -> dict:
    """This checkout at ``small`` and ``large`` files (the ratio large/small), and ``rev``'s code at ``large``."""
    now = {"small": _child(REPO / "exporter", small), "large": _child(REPO / "exporter", large)}
    out = {"status": "ok", "small_files": small, "large_files": large, "now": now,
           "ratio_large_small_idle": round(now["large"]["cpu_share_idle"] / max(now["small"]["cpu_share_idle"], 1e-9), 1),
           "ratio_large_small_long_idle": round(now["large"]["cpu_share_long_idle"]
                                                / max(now["small"]["cpu_share_long_idle"], 1e-9), 1)}
    with tempfile.TemporaryDirectory() as d:
        tar = Path(d) / "before.tar"
        with open(tar, "wb") as f:
            r = subprocess.run(["git", "-C", str(REPO), "archive", rev, "exporter/omniwatch"], stdout=f,
                               stderr=subprocess.PIPE)
        if r.returncode:
            out["before"] = {"status": "n/a", "why": f"git archive {rev}: {r.stderr.decode()[-300:]}"}
            return out
        with tarfile.open(tar) as t:
            t.extractall(d, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(d)
        out["before_rev"] = rev
        out["before"] = {"large": _child(Path(d) / "exporter", large)}
    b = out["before"]["large"]
    out["large_now_vs_before_long_idle"] = round(now["large"]["cpu_share_long_idle"] / max(b["cpu_share_long_idle"], 1e-9), 3)
    out["large_now_vs_before_idle"] = round(now["large"]["cpu_share_idle"] / max(b["cpu_share_idle"], 1e-9), 3)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args[args.index("--files") + 1]) if "--files" in args else 100_000
    pos = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] not in ("--files", "--timeline"))]
    sys.path.insert(0, pos[0] if pos else str(REPO / "exporter"))
    if "--timeline" in args:
        r = timeline(n, float(args[args.index("--timeline") + 1]))
        print(json.dumps(r) if "--json" in args else r)
        sys.exit(0)
    r = measure(n)
    print(json.dumps(r) if "--json" in args else
          f"{n:,} idle files: {100 * r['cpu_share_idle']:.1f} % of a core idle 30 s, "
          f"{100 * r['cpu_share_long_idle']:.1f} % idle 2.5 min (first pass {r['first_pass_cpu_s']:.1f} s CPU)")
