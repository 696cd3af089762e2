"""Issue 25 item 12: 100,000 idle files under ``--watch`` cost 70-80 % of a core. Idle files wait in a calendar
of passes (a pass touches only the files due in it), files idle for 2.5 min are looked at every 16th poll, and a
rescan lists a directory again only when its mtime moved. The figures: ``make bench`` section ``idle``
(docs/benchmarks.md); these tests hold the behaviour the figures depend on."""
from __future__ import annotations

import os
import time

import orjson

from omniwatch.model import RunStore
from omniwatch.sources import files as F
from omniwatch.sources.files import FileSource


def _steps(n: int) -> bytes:
    return b"".join(orjson.dumps({"step": s, "data": {"timing_s/step": 5.0}}) + b"\n" for s in range(1, n + 1))


def test_long_idle_files_are_looked_at_every_16th_poll_and_a_resumed_one_is_seen(tmp_path):
    root = tmp_path / "root" / "p"
    root.mkdir(parents=True)
    for e in range(64):
        (root / f"e{e}.jsonl").write_bytes(_steps(2))
    store = RunStore(max_runs=100)
    src = FileSource(store, [str(tmp_path / "root")], "jsonl")
    src.poll_once()
    for t in src.tails.values():
        t.unchanged_polls = F.LONG_IDLE_AFTER_POLLS  # as 2.5 min of polls would leave them
    src.poll_once()  # looked at once more, then each waits in the calendar
    looked = sum(t.unchanged_polls for t in src.tails.values())
    for _ in range(4 * F.LONG_IDLE_EVERY):
        src.poll_once()
    looked = sum(t.unchanged_polls for t in src.tails.values()) - looked
    assert looked == 64 * 4, "each long-idle file looked at once every LONG_IDLE_EVERY polls"
    assert not src._active  # nothing idle is polled every pass
    with open(root / "e9.jsonl", "ab") as f:
        f.write(orjson.dumps({"step": 3, "data": {"timing_s/step": 5.0}}) + b"\n")
    for n in range(1, F.LONG_IDLE_EVERY + 1):
        src.poll_once()
        if store.runs[("p", "e9")].steps_total == 3:
            break
    assert store.runs[("p", "e9")].steps_total == 3 and n <= F.LONG_IDLE_EVERY
    # control: the resumed file is polled every pass again, the others stay in the calendar
    assert list(src._active) == [str(root / "e9.jsonl")]
    with open(root / "e9.jsonl", "ab") as f:
        f.write(orjson.dumps({"step": 4, "data": {"timing_s/step": 5.0}}) + b"\n")
    src.poll_once()
    assert store.runs[("p", "e9")].steps_total == 4


def test_a_rescan_finds_new_files_and_projects_and_skips_unchanged_directories(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "p").mkdir(parents=True)
    (root / "p" / "a.jsonl").write_bytes(_steps(1))
    clock = [time.time()]
    src = FileSource(RunStore(), [str(root)], "jsonl", clock=lambda: clock[0])
    src.poll_once()
    # a file created in the same directory right away (within one mtime tick: the racy window) is found
    (root / "p" / "b.jsonl").write_bytes(_steps(1))
    (root / "q").mkdir()
    (root / "q" / "c.jsonl").write_bytes(_steps(1))
    clock[0] += F.RESCAN_SECONDS
    src.poll_once()
    assert sorted(os.path.basename(p) for p in src.tails) == ["a.jsonl", "b.jsonl", "c.jsonl"]
    # an old, unchanged directory is not listed again: only stat()ed
    old = time.time() - 3600
    for d in (root, root / "p", root / "q"):
        os.utime(d, (old, old))
    listed = []
    real = os.scandir
    monkeypatch.setattr(F.os, "scandir", lambda p: (listed.append(p), real(p))[1])
    clock[0] += F.RESCAN_SECONDS
    src.poll_once()  # re-lists once: the mtimes moved (utime)
    listed.clear()
    clock[0] += F.RESCAN_SECONDS
    src.poll_once()
    assert listed == []
    (root / "p" / "d.jsonl").write_bytes(_steps(1))  # moves p's mtime
    clock[0] += F.RESCAN_SECONDS
    src.poll_once()
    assert listed == [str(root / "p")] and str(root / "p" / "d.jsonl") in src.tails
