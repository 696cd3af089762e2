"""Issue 25 item 12: 100,000 idle files under ``--watch`` cost 70-80 % of a core. Idle files wait in a calendar
of passes (a pass touches only the files due in it), files idle for 2.5 min are looked at every 16th poll, and a
rescan lists a directory again only when its mtime moved. The figures: ``make bench`` section ``idle``
(docs/benchmarks.md); these tests hold the behaviour the figures depend on."""
from __future__ import annotations

import os
import time

import orjson

from omniwatch.core.model import RunStore
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


# --- issue 35 item 5: a file's own age picks its tier from the first look; a pass has a budget of looks --------------
def _count_looks(monkeypatch) -> list[int]:
    from omniwatch.sources import tail as T
    calls = [0]
    real = T.FileTail.poll

    def poll(self):
        calls[0] += 1
        return real(self)
    monkeypatch.setattr(T.FileTail, "poll", poll)
    return calls


def test_old_idle_files_start_in_the_deepest_tier_and_a_resumed_one_is_seen(tmp_path, monkeypatch):
    """Before: 100,000 idle files were each looked at every poll for the exporter's first 30 s and every 4th for 2
    more minutes, whatever their age (72-75 % of a core). Now a file last written half an hour ago is looked at
    every DORMANT_EVERY-th poll from its first read. Control: one written again is read within that many polls and
    is then looked at every poll."""
    root = tmp_path / "root" / "p"
    root.mkdir(parents=True)
    old = time.time() - 86_400
    for e in range(200):
        f = root / f"e{e}.jsonl"
        f.write_bytes(_steps(2))
        os.utime(f, (old, old))
    store = RunStore(max_runs=500)
    src = FileSource(store, [str(tmp_path / "root")], "jsonl")
    src.poll_once()   # everything read once
    looks = _count_looks(monkeypatch)
    every = getattr(F, "DORMANT_EVERY", 64)
    for _ in range(2 * every):
        src.poll_once()
    assert looks[0] <= 200 * 2 + 200, f"{looks[0]} looks at 200 day-old files in {2 * every} polls"
    with open(root / "e7.jsonl", "ab") as f:
        f.write(orjson.dumps({"step": 3, "data": {"timing_s/step": 5.0}}) + b"\n")
    for n in range(1, every + 1):
        src.poll_once()
        if store.runs[("p", "e7")].steps_total == 3:
            break
    assert store.runs[("p", "e7")].steps_total == 3
    assert str(root / "e7.jsonl") in src._active


def test_a_pass_looks_at_no_more_files_than_its_budget(tmp_path, monkeypatch):
    """Before: files written a moment before the exporter started were all looked at in every pass for 30 s (and
    every 4th pass for 2 minutes). Now a pass looks at no more than MAX_LOOKS_PER_PASS (here 100), the active ones
    in turn (a first read weighs FIRST_READ_WEIGHT looks). Control: every file is still read."""
    monkeypatch.setattr(F, "MAX_LOOKS_PER_PASS", 100, raising=False)
    root = tmp_path / "root" / "p"
    root.mkdir(parents=True)
    for e in range(1000):
        (root / f"e{e}.jsonl").write_bytes(_steps(1))
    store = RunStore(max_runs=2000)
    src = FileSource(store, [str(tmp_path / "root")], "jsonl")
    looks = _count_looks(monkeypatch)
    per_pass = []
    for _ in range(1000 * getattr(F, "FIRST_READ_WEIGHT", 1) // 100 + 10):   # a first read weighs FIRST_READ_WEIGHT
        before = looks[0]
        src.poll_once()
        per_pass.append(looks[0] - before)
    assert max(per_pass) <= 100, per_pass
    assert len(store.runs) == 1000   # every file was read (100 a pass, in turn)
