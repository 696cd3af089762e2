"""Issue 25 items 9-12: hostile and long names, big files and symlinks in the offline commands.

- 9: labels were cut at 128 characters while lookups used the full name: live, two sweep runs sharing their
  first 128 characters merged (the second's steps dropped as duplicates); in a log-root index a long-named
  run's alerts were charged to every run. Names are made unique 128-character labels at load, and the log and
  the report say how.
- 10: ``a b/e`` and ``a_b/e`` shared one index page; ``p/e``, ``p/e~2`` and ``q/p/e`` made the index refuse.
- 11: rich console markup in a name (``a[`` + ``]b.jsonl`` is the run ``a[/]b``) crashed ``report DIR``,
  ``backtest``, ``omniwatch alerts`` and ``compare``; a ``*.jsonl`` larger than memory killed ``report``.
- 12: ``report DIR`` followed a symlink out of the root; a shared page printed the absolute path of its file;
  a second corrupt state file overwrote the first saved copy.
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from omniwatch.backtest.runfile import load_run
from omniwatch.core.model import RunStore
from omniwatch.report.gather import unique_labels
from omniwatch.runlabel import MAX_LABEL_CHARS, fit_label
from omniwatch.simulate import Fault, RunSpec, step_dict
from omniwatch.sources.files import FileSource
from omniwatch.core.state import Checkpointer

STEM = "flowgrpo_sd35_lr3e-6_kl0.001_bs256_" + "x" * 110  # sweep names: 145 characters in common
LONG_A, LONG_B = STEM + "_seed1_rewardslow", STEM + "_seed2_healthy"


def write_run(path: Path, spec: RunSpec | None = None, steps: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = spec or RunSpec(seed=1)
    path.write_bytes(b"".join(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n" for s in range(1, steps + 1)))
    return path


def cli(*args: str, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniwatch", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


# --- item 9: long names, live ---------------------------------------------------------------------------------------
def test_two_long_names_sharing_128_characters_stay_two_runs_live(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root = tmp_path / "root"
    for name in (LONG_A, LONG_B):
        write_run(root / "sweep" / f"{name}.jsonl")
    write_run(root / "sweep" / "short.jsonl")  # control: a name that fits is its own label
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    assert len(store.runs) == 3, sorted(store.runs)
    assert all(r.steps_total == 3 for r in store.runs.values())
    assert store.errors.get(("jsonl", "duplicate_step"), 0) == 0
    labels = {e for _, e in store.runs}
    assert "short" in labels and all(len(e) <= MAX_LABEL_CHARS for e in labels)
    assert fit_label(LONG_A) in labels and fit_label(LONG_B) in labels and fit_label(LONG_A) != fit_label(LONG_B)
    # a lookup by the full name finds the run (the log-writer check, the checkpoint's reveal)
    store.set_log_open("sweep", LONG_A, True)
    assert store.runs[("sweep", fit_label(LONG_A))].planned.log_open is True
    said = [r.getMessage() for r in caplog.records if "shortened" in r.getMessage()]
    assert len(said) == 2 and all("SHA-256" in m for m in said)
    src.poll_once()  # said once per file, not per poll
    assert len([r for r in caplog.records if "shortened" in r.getMessage()]) == 2


def test_fit_label_is_unique_idempotent_and_strips_control_characters():
    assert fit_label("plain") == "plain" and fit_label(fit_label(LONG_A)) == fit_label(LONG_A)
    assert len(fit_label(LONG_A)) == MAX_LABEL_CHARS and fit_label(LONG_A)[:119] == LONG_A[:119]
    assert fit_label("a\nb\x00c\u202e") == "abc" and fit_label("\n") == "_"


def test_unique_labels_of_a_log_root(tmp_path):
    """Item 10's colliding names and item 9's long ones: every run keeps a distinct <= 128-char label; a run
    literally named e~2 keeps its name; the note says how a label was made."""
    paths = [write_run(tmp_path / "p" / "e.jsonl"), write_run(tmp_path / "p" / "e~2.jsonl"),
             write_run(tmp_path / "q" / "p" / "e.jsonl"),
             write_run(tmp_path / "sweep" / f"{LONG_A}.jsonl"), write_run(tmp_path / "sweep" / f"{LONG_B}.jsonl")]
    runs = [load_run(str(p)) for p in paths]
    unique_labels(runs)
    keys = [(r.project, r.experiment) for r in runs]
    assert len(set(keys)) == 5 and all(len(e) <= MAX_LABEL_CHARS for _, e in keys)
    assert keys[:3] == [("p", "e"), ("p", "e~2"), ("p", "e~3")]
    assert "another run" in runs[2].label_note and "SHA-256" in runs[3].label_note and not runs[0].label_note


# --- items 9, 10, 11, 12 through `omniwatch report DIR` --------------------------------------------------------------
HOSTILE = ("a[", "]b")  # the run a[/]b: rich's closing tag


def hostile_root(root: Path) -> dict[str, Path]:
    files = {
        "slow": write_run(root / "sweep" / f"{LONG_A}.jsonl", RunSpec(seed=11, faults=[Fault("reward_slow", 1, factor=4.0)]), 40),
        "long_healthy": write_run(root / "sweep" / f"{LONG_B}.jsonl", RunSpec(seed=12), 40),
        "healthy": write_run(root / "other" / "healthy.jsonl", RunSpec(seed=13), 40),
        "a b": write_run(root / "a b" / "e.jsonl", RunSpec(seed=14), 12),
        "a_b": write_run(root / "a_b" / "e.jsonl", RunSpec(seed=15), 12),
        "p/e": write_run(root / "p" / "e.jsonl", RunSpec(seed=16), 12),
        "p/e~2": write_run(root / "p" / "e~2.jsonl", RunSpec(seed=17), 12),
        "q/p/e": write_run(root / "q" / "p" / "e.jsonl", RunSpec(seed=18), 12),
        "markup": write_run(root / HOSTILE[0] / f"{HOSTILE[1]}.jsonl", RunSpec(seed=19), 12),
    }
    return files


@pytest.mark.integration
def test_report_of_a_hostile_log_root(tmp_path):
    root = tmp_path / "verl-logs"
    files = hostile_root(root)
    outside = write_run(tmp_path / "elsewhere" / "private.jsonl", RunSpec(seed=20), 12)
    (root / "p" / "linked_out.jsonl").symlink_to(outside)            # item 12: out of the root: refused
    (root / "p" / "linked_in.jsonl").symlink_to(files["a_b"])        # control: a link inside the root is a run
    out = tmp_path / "site" / "index.html"
    r = cli("report", str(root), "-o", str(out), "--json", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    runs = got["runs"]

    def run_of(file_name: str) -> dict:
        return next(x for x in runs if x["run"].endswith(os.sep + file_name))
    # item 12: the symlink out of the root is not a run, and is named; the one inside is
    assert not any("private" in x["run"] or "linked_out" in x["run"] for x in runs)
    assert "not followed" in r.stderr and "linked_out" in r.stderr
    assert any(x["run"].endswith("linked_in.jsonl") for x in runs)
    # items 9, 10: one page per run, ten runs, ten distinct names and pages
    assert len(runs) == 10 and len({x["name"] for x in runs}) == 10 and len({x["page"] for x in runs}) == 10
    assert all(Path(x["page"]).is_file() for x in runs)
    # item 9: the long-named faulty run's alerts are its own; the long healthy twin and the control lose nothing
    slow, twin = run_of(f"{LONG_A}.jsonl"), run_of(f"{LONG_B}.jsonl")
    assert slow["top"] == "RewardBoundRollout" and slow["lost"] > 0
    healthy = next(x for x in runs if x["name"] == "other/healthy")
    assert healthy["lost"] == 0 and twin["lost"] == 0 and "RewardBoundRollout" not in twin["alerts"]
    html = out.read_text()
    assert "SHA-256" in html  # the index says how the long names were shortened
    # item 12: no page names the absolute path of the machine that built it
    for x in runs:
        page = Path(x["page"]).read_text()
        assert str(tmp_path) not in page, x["page"]
    assert "other/healthy.jsonl" in Path(healthy["page"]).read_text()  # control: the file is named, relatively
    # item 11: the terminal output of the same root (rich table with the a[/]b run) does not crash
    t = cli("report", str(root), "-o", str(tmp_path / "site2" / "index.html"), "--no-alerts", "--quiet")
    assert t.returncode == 0 and "a[/]b" in t.stdout and "Traceback" not in t.stderr, t.stderr[-2000:]


@pytest.mark.integration
def test_report_of_a_run_named_with_markup_writes_its_page(tmp_path):
    """Item 11 on `report FILE` (before: MarkupError, nothing written) and `compare`."""
    f = write_run(tmp_path / HOSTILE[0] / f"{HOSTILE[1]}.jsonl", RunSpec(seed=3), 12)
    g = write_run(tmp_path / "[bold]x[/bold]" / "[/].jsonl", RunSpec(seed=4), 12)
    page = tmp_path / "out.html"
    r = cli("report", str(f), "--no-alerts", "-o", str(page), "--quiet")
    assert r.returncode == 0 and page.is_file() and "a[/]b" in r.stdout, r.stderr[-2000:]
    assert str(tmp_path) not in page.read_text() and "]b.jsonl" in page.read_text()
    c = cli("compare", str(f), str(g), "--quiet")
    assert c.returncode == 0 and "a[/]b" in c.stdout and "[bold]x[/bold]/[/]" in c.stdout, c.stderr[-2000:]


@pytest.mark.integration
def test_backtest_of_a_run_named_with_markup(tmp_path):
    f = write_run(tmp_path / HOSTILE[0] / f"{HOSTILE[1]}.jsonl", RunSpec(seed=11, faults=[Fault("reward_slow", 1, factor=4.0)]), 40)
    r = cli("backtest", str(f))
    assert r.returncode == 0 and "a[/]b" in r.stdout and "RewardBoundRollout" in r.stdout, r.stderr[-2000:]


def test_alerts_table_of_runs_named_with_markup():
    """`omniwatch alerts` renders what the exporter serves; names, summaries and errors are text, not markup."""
    from omniwatch.relay.commands import render
    alerts = [{"receivedAt": "2025-01-01T00:00:00Z", "status": "firing", "endsAt": None,
               "labels": {"alertname": "TrainingStalled[/]", "project": "a[", "experiment": "]b"},
               "annotations": {"step": "[/]", "summary": "Run a[/]b made no step [red]"}}]
    status = {"receivers": [{"name": "[/]feishu", "type": "feishu", "enabled": False, "config_error": "[/x]",
                             "pending": 0, "delivered": 1, "failed": 0, "last_error": "HTTP 500 [/]"}],
              "config_error": "bad [/] config"}
    buf = io.StringIO()
    render(alerts, status, Console(file=buf, width=300))
    out = buf.getvalue()
    assert "a[/]b" in out and "TrainingStalled[/]" in out and "bad [/] config" in out and "HTTP 500 [/]" in out


# --- item 11: a file larger than memory is streamed -----------------------------------------------------------------
RSS_PROBE = """
import resource, sys
from omniwatch.backtest.runfile import load_run
run = load_run(sys.argv[1])
print(len(run.entries), run.skipped.get("line_too_long", 0), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_kib(path: Path) -> tuple[int, int, int]:
    r = subprocess.run([sys.executable, "-c", RSS_PROBE, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    n, skipped, rss = map(int, r.stdout.split())
    return n, skipped, rss


def test_a_file_far_larger_than_its_steps_is_read_with_bounded_memory(tmp_path):
    """A JSONL of 12 steps and 384 MiB of overlong lines (a trainer that dumped tensors into its log) is read
    in 1 MiB chunks: peak RSS within 48 MiB of the same 12 steps alone (before: the whole file, then its
    lines, were held: RSS grew by more than the file)."""
    steps = [orjson.dumps({"step": s, "data": step_dict(RunSpec(seed=5), s)}) + b"\n" for s in range(1, 13)]
    control = tmp_path / "p" / "control.jsonl"
    control.parent.mkdir(parents=True)
    control.write_bytes(b"".join(steps))
    big = tmp_path / "p" / "big.jsonl"
    junk = b"x" * (8 << 20) + b"\n"   # 8 MiB lines: over the 1 MiB line limit
    with open(big, "wb") as f:
        for i, s in enumerate(steps):
            f.write(s)
            for _ in range(4):
                f.write(junk)
        f.write(b"y" * (16 << 20))    # and a last line with no end at all
    assert big.stat().st_size > 384 << 20
    n0, sk0, rss0 = _peak_kib(control)
    n1, sk1, rss1 = _peak_kib(big)
    assert (n0, sk0) == (12, 0) and (n1, sk1) == (12, 12 * 4 + 1)
    assert rss1 - rss0 < 48 * 1024, f"peak RSS {rss1 / 1024:.0f} MiB vs control {rss0 / 1024:.0f} MiB"


# --- item 12: a second corrupt state file keeps the first saved copy -------------------------------------------------
def test_a_second_corrupt_state_file_does_not_overwrite_the_first_copy(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    path = state / "exporter-state.json"
    bodies = [b"[]", b'{"version": 1, "model": []}', b"not json at all"]
    for body in bodies:
        path.write_bytes(body)
        store = RunStore()
        assert Checkpointer(store, [], str(state)).load() is False
        assert store.errors[("state", "corrupt_state")] == 1 and not path.exists()
    copies = sorted(state.glob("exporter-state.corrupt*"))
    assert [p.name for p in copies] == ["exporter-state.corrupt", "exporter-state.corrupt.2", "exporter-state.corrupt.3"]
    assert {p.read_bytes() for p in copies} == set(bodies)
    assert (state / "exporter-state.corrupt").read_bytes() == bodies[0]  # the first failure's evidence


def test_corrupt_copies_are_bounded(tmp_path):
    from omniwatch.core.state import MAX_CORRUPT_COPIES
    state = tmp_path / "state"
    state.mkdir()
    path = state / "exporter-state.json"
    for i in range(MAX_CORRUPT_COPIES + 3):
        path.write_bytes(b"[%d]" % i)
        os.utime(state, None)
        Checkpointer(RunStore(), [], str(state)).load()
    assert len(list(state.glob("exporter-state.corrupt*"))) == MAX_CORRUPT_COPIES


def test_page_names_do_not_collide_for_names_that_differ_only_outside_the_safe_alphabet(tmp_path):
    from omniwatch.report.facts import RunFacts
    from omniwatch.report.index import page_paths
    def facts(p, e):
        return RunFacts(run=f"/x/{p}/{e}.jsonl", project=p, experiment=e, source="jsonl", steps=[], gpu_seconds={},
                        gpus=None, gpus_source="unknown", modes={})
    fs = [facts("a b", "e"), facts("a_b", "e"), facts("A_B", "e"), facts("p", "é" * 128), facts("p", "e")]
    paths = page_paths(tmp_path, fs)
    assert len({str(p).casefold() for p in paths}) == 5
    assert all(len(p.name.encode()) <= 255 and re.fullmatch(r"[A-Za-z0-9_.~-]+", p.name) for p in paths)
