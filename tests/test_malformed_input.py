"""Malformed input is said, not only counted (issue 27 item 8): the exporter logs the file and line number
of the first bad lines of each file and then one summary at most a minute per file; `report` says how many
lines it skipped and why. (`status` printing the counts per watch path: tests/test_head_node.py.)"""
from __future__ import annotations

import json
import logging
import subprocess
import sys

from omniwatch.core.model import RunStore
from omniwatch.sources import book
from omniwatch.sources.files import FileSource

from .conftest import fixture_path

GOOD = fixture_path("flowgrpo_healthy").read_text().splitlines()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_first_bad_lines_are_logged_with_file_and_line_then_rate_limited(tmp_path, caplog):
    root = tmp_path / "logs" / "proj"
    root.mkdir(parents=True)
    f = root / "exp.jsonl"
    f.write_text("\n".join(GOOD[:2] + ["{bad"] * 10 + GOOD[2:3]) + "\n")
    src = FileSource(RunStore(), [str(tmp_path / "logs")])
    clock = Clock()
    src.book.clock = clock
    with caplog.at_level(logging.WARNING, logger="omniwatch.sources.files"):
        src.poll_once()
        msgs = [r.getMessage() for r in caplog.records]
        assert [m for m in msgs if "skipped: malformed_json" in m] == [
            f"jsonl source: {f} line {n} skipped: malformed_json" for n in (3, 4, 5)]
        assert not [m for m in msgs if "more line(s)" in m]  # the other 7 wait for the summary
        caplog.clear()
        with f.open("a") as out:
            out.write("{bad\n")
        src.poll_once()  # within the minute: nothing logged
        assert not caplog.records
        clock.t += book.SUMMARY_SECONDS
        with f.open("a") as out:
            out.write("{bad\n")
        src.poll_once()
        msgs = [r.getMessage() for r in caplog.records]
        assert msgs == [f"jsonl source: {f}: 9 more line(s) skipped (last: line 15, malformed_json); "
                        f"12 of 15 lines skipped so far"], msgs
    (row,) = src.describe()
    assert row["skipped"] == {"malformed_json": 12} and row["lines"] == 15 and row["runs"] == 1
    assert row["first_bad"][0] == {"file": str(f), "line": 3, "reason": "malformed_json"}


def test_a_missing_watch_path_is_said_once_and_its_appearance_too(tmp_path, caplog):
    root = tmp_path / "verl-logs"
    src = FileSource(RunStore(), [str(root)])
    with caplog.at_level(logging.INFO, logger="omniwatch.sources.files"):
        src.scan()
        src.scan()
        msgs = [r.getMessage() for r in caplog.records]
        assert len([m for m in msgs if "does not exist" in m]) == 1, msgs
        assert src.describe()[0]["exists"] is False
        (root / "p").mkdir(parents=True)
        (root / "p" / "e.jsonl").write_text(GOOD[0] + "\n")
        src.scan()
        assert any(f"watch path {root} appeared (1 file(s))" in r.getMessage() for r in caplog.records)
    src.poll_once()
    assert src.describe()[0] | {"first_bad": []} == {
        "kind": "jsonl", "spec": str(root), "exists": True, "files": 1, "runs": 1, "lines": 1, "skipped": {},
        "first_bad": []}


def test_report_says_how_many_lines_it_skipped_and_why(tmp_path):
    f = tmp_path / "run.jsonl"
    f.write_text("\n".join(GOOD[:3] + ["{bad", "[1,", "x", "{", "}"]) + "\n")
    r = subprocess.run([sys.executable, "-m", "omniwatch", "report", str(f), "--no-alerts", "-o",
                        str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "5 of 8 lines skipped (malformed_json 5)" in r.stdout, r.stdout
    j = subprocess.run([sys.executable, "-m", "omniwatch", "report", str(f), "--no-alerts", "--json"],
                       capture_output=True, text=True, timeout=120)
    out = json.loads(j.stdout)
    assert out["lines"] == 8 and out["skipped"] == {"malformed_json": 5}
