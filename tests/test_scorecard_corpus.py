"""The scorecard's public corpus (tests/fixtures/scorecard, docs/scorecard.md): it is exactly what its generator writes
through verl's own Tracking logger, every truth file is consistent with its run, the corpus covers what issue 30 asks
for, and a resumed run replays as the live exporter read it (the JSONL truncated by the resumed trainer, or the
console log both trainers appended to)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from omniwatch import rules
from omniwatch.backtest.backtest import backtest_many
from omniwatch.backtest.runfile import load_run
from omniwatch.scorecard import corpus, truth

from .conftest import FIXTURES, REPO, REQUIRE_RAY, skip_optional

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

CORPUS = FIXTURES / corpus.PROJECT
TRUTHS = truth.load_all(CORPUS)
BY_NAME = {t.experiment: t for t in TRUTHS}


@pytest.mark.slow
def test_the_corpus_is_what_its_generator_writes_through_verls_tracking(tmp_path):
    if importlib.util.find_spec("verl") is None:
        if REQUIRE_RAY:
            pytest.fail("verl is not installed (OMNIWATCH_REQUIRE_RAY=1: .ci/install-ray-tq.sh installs it)")
        skip_optional("verl is not installed (the corpus is written through verl.utils.tracking.Tracking)",
                      "make test-ray")
    written = corpus.write_corpus(tmp_path, repo=REPO)
    have = sorted(p.relative_to(FIXTURES) for p in CORPUS.rglob("*") if p.is_file())
    assert written == have, "regenerate with `make scorecard-corpus` (then `make scorecard`)"
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (FIXTURES / rel).read_bytes(), \
            f"{rel} differs from what corpus.py writes: regenerate with `make scorecard-corpus`"


def test_the_table_and_the_truth_files_name_the_same_runs():
    assert sorted(c.name for c in corpus.CASES) == sorted(BY_NAME)
    assert len(TRUTHS) >= 30


def test_every_truth_replays_and_names_alerts_that_exist():
    alerts = {(a.name, a.labels.get("severity")) for a in rules.load_alerts()}
    names_ = {a for a, _ in alerts}
    for t in TRUTHS:
        run = truth.load_run(t)
        assert (run.project, run.experiment) == (t.project, t.experiment)
        steps = {e.step for e in run.entries}
        for f in t.faults:
            for m in f.named_by:
                assert m.labels["alertname"] in names_, (t.experiment, m.labels)
            if f.kind == "hang" and f.shape == "stop":
                assert f.first_step == max(steps) + 1 and t.silence_after_s >= 3 * 3600, t.experiment
            else:
                assert {f.first_step, f.last_step} <= steps, (t.experiment, f.kind)
        if t.trainer_config:
            assert run.trainer_config is not None and run.trainer_config.experiment == t.experiment
        assert t.healthy == (not t.faults and not t.changes)


def test_the_corpus_covers_issue_30s_cases():
    shapes: dict[str, set] = {}
    for t in TRUTHS:
        for f in t.faults:
            shapes.setdefault(f.kind, set()).add(f.shape)
    for kind in ("gen_slow", "actor_slow", "reward_slow", "idle_gap", "phase_slow"):
        assert {"step", "episode", "creep", "early", "resume"} <= shapes[kind], kind
    assert sum(len(t.faults) == 2 for t in TRUTHS) >= 2  # two overlapping faults
    layouts = {(t.layout["trainer"], t.layout["reward"], t.layout["async_mode"]) for t in TRUTHS}
    assert {("legacy", "colocated", "sync"), ("legacy", "pool", "sync"), ("legacy", "function", "sync"),
            ("v1", "function", "sync"), ("v1", "function", "separate_async")} <= layouts
    assert any(t.layout.get("lora") for t in TRUTHS) and any(t.layout["pace_s"] >= 900 for t in TRUTHS)
    workload = [t for t in TRUTHS if t.changes]
    assert {c.kind for t in workload for c in t.changes} == {"workload"}
    assert any(not t.faults for t in workload) and any(t.faults for t in workload)
    assert any(t.warmup_step_s and t.warmup_step_s >= 20 * 60 for t in TRUTHS)  # the hang after a 21-min warm-up
    healthy = [t for t in TRUTHS if t.healthy]
    assert max(t.lines for t in healthy) >= 200 and max(t.layout["step_jitter"] for t in healthy) >= 0.15
    assert any(t.layout.get("checkpoint_factor", 0) >= 3 for t in healthy)
    assert sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file()) < 6 * 2**20


def _restarts(run) -> int:
    seen = {}

    def observe(ri, i, store, rec):
        seen["n"] = store.runs[(run.project, run.experiment)].restarts_total
    backtest_many([run], evaluate=False, observe=observe)
    return seen["n"]


def test_a_resume_replays_as_the_live_exporter_read_it():
    """gen_resume: the file as verl left it holds the resumed trainer's steps 31-60 only; replayed with what it held
    when the first trainer died (steps 1-40), the truncation between them restarts the run in the exporter's store,
    as the live file source does (RunStore.trainer_restarted). actor_resume's console log holds both incarnations."""
    t = BY_NAME["gen_resume"]
    run = truth.load_run(t)
    assert t.replay == ["gen_resume.jsonl.before-resume", "gen_resume.jsonl"]
    assert [e.step for e in run.entries] == list(range(1, 41)) + list(range(31, 61))
    assert run.truncated_before == [40] and _restarts(run) == 1
    only = load_run(str(Path(t.path).parent / "gen_resume.jsonl"))
    assert [e.step for e in only.entries] == list(range(31, 61))
    c = BY_NAME["actor_resume"]
    run = truth.load_run(c)
    assert c.replay == ["actor_resume.console.log"] and run.trainer_config is not None
    assert [e.step for e in run.entries] == list(range(1, 41)) + list(range(31, 61))
    assert run.truncated_before == [] and _restarts(run) == 1  # the step went back
