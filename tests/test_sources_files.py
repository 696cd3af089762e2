"""The JSONL and console sources end to end into the collector: labels from verl's layout, the
console twin yielding the same contract series, bad lines counted, truncation handled."""
import shutil

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch import names
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.sources.files import FileSource, run_labels

from .conftest import fixture_path

CONTRACT = [names.STEP, names.STEPS_TOTAL, names.STEP_DURATION, names.STAGE_DURATION, names.STAGE_SECONDS_TOTAL,
            names.REWARD_BOUND_RATIO, names.INTER_STAGE_IDLE_RATIO, names.MFU, names.MFU_BASELINE,
            names.TYPICAL_STEP, names.THROUGHPUT, names.REWARD_BOUND_WINDOW, names.IDLE_WINDOW, names.MFU_WINDOW]


def series(store, only=None):
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(store)).decode()):
        for s in fam.samples:
            if only is None or s.name in only:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_run_labels_follow_verl_layout():
    assert run_labels("/logs/my_project/exp-1.jsonl") == ("my_project", "exp-1")
    assert run_labels("/logs/proj/exp.console.log") == ("proj", "exp")


def test_root_layout_labels_every_series_and_console_twin_agrees(tmp_path):
    root = tmp_path / "root"
    (root / "flowgrpo").mkdir(parents=True)
    shutil.copy(fixture_path("flowgrpo_reward_bound"), root / "flowgrpo" / "rb.jsonl")
    (tmp_path / "logs" / "flowgrpo").mkdir(parents=True)
    shutil.copy(fixture_path("flowgrpo_reward_bound", ".console.log"), tmp_path / "logs" / "flowgrpo" / "rb.log")

    a = RunStore()
    FileSource(a, [str(root)], "jsonl").poll_once()
    b = RunStore()
    FileSource(b, [str(tmp_path / "logs" / "flowgrpo" / "rb.log")], "console").poll_once()
    sa, sb = series(a, CONTRACT), series(b, CONTRACT)
    assert sa and sa == sb
    assert sa[(names.STEP, (("experiment", "rb"), ("project", "flowgrpo")))] == 40
    assert sa[(names.STEPS_TOTAL, (("experiment", "rb"), ("project", "flowgrpo")))] == 40


def test_bad_lines_are_counted_and_good_ones_kept(tmp_path):
    p = tmp_path / "proj" / "exp.jsonl"
    p.parent.mkdir()
    good = fixture_path("flowgrpo_healthy").read_bytes().splitlines()
    p.write_bytes(b"\n".join([good[0], b"garbage", b'{"step": "x"}', b'{"step": 2, "data": {"a": "s", "b": null}}',
                              b"[]", good[2]]) + b"\n")
    st = RunStore()
    FileSource(st, [str(p)], "jsonl").poll_once()
    s = series(st)
    err = lambda reason: s.get((names.INGEST_ERRORS, (("reason", reason), ("source", "jsonl"))))  # noqa: E731
    assert err("malformed_json") == 1 and err("bad_step") == 1 and err("not_object") == 1
    assert err("non_numeric") == 1 and err("non_finite") == 1
    assert s[(names.STEPS_TOTAL, (("experiment", "exp"), ("project", "proj")))] == 3


def test_truncated_file_mid_run_keeps_counters_monotonic(tmp_path):
    p = tmp_path / "proj" / "exp.jsonl"
    p.parent.mkdir()
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:30]))
    st = RunStore()
    src = FileSource(st, [str(p)], "jsonl")
    src.poll_once()
    key = (names.STEPS_TOTAL, (("experiment", "exp"), ("project", "proj")))
    assert series(st)[key] == 30
    with open(p, "wb") as f:  # the trainer restarts from the step-25 checkpoint: "wb" truncates
        f.write(b"".join(lines[25:40]))
    src.poll_once()
    s = series(st)
    assert s[key] == 40
    assert s[(names.STEPS_REPLAYED_TOTAL, (("experiment", "exp"), ("project", "proj")))] == 5
    assert s[(names.TRAINER_RESTARTS_TOTAL, (("experiment", "exp"), ("project", "proj")))] == 1


def test_unreadable_file_marks_the_source_down_without_crashing(tmp_path):
    (tmp_path / "proj").write_text("a file where verl expects the project directory")
    p = tmp_path / "proj" / "exp.jsonl"  # stat() fails with NotADirectoryError, not "missing"
    st = RunStore()
    src = FileSource(st, [str(p)], "jsonl")
    src.poll_once()
    s = series(st)
    assert s[(names.SOURCE_UP, (("source", "jsonl"), ("target", str(p))))] == 0
