"""The promtool tests in alerts/tests/ are hand-written literal YAML (issue 23 item 2, kubernetes-mixin style): every
expected annotation is the literal text Prometheus must render, every alert is checked just before and just after
its ``for:``, and the tests bite: a loosened threshold, window or ``for:`` of the step, signal and health alerts, or a
changed word in an alert's text, makes ``promtool test rules`` fail naming the alert (the endpoint rules' thresholds:
tests/test_endpoint_rules.py)."""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from omniwatch import rules
from omniwatch import config
from omniwatch.alerting import rulefiles as render
from omniwatch.alerting import rulespec
from omniwatch.config import DEFAULT

from .conftest import REPO, require_tool as tool
from omniwatch.yamlio import load as yaml_load

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

TESTS = REPO / "alerts" / "tests"
DOCS = {p.name: yaml_load(p.read_text()) for p in sorted(TESTS.glob("*.test.yml"))}


def seconds(text: str) -> int:
    """A promtool duration (``1h2m3s``, ``75s``, ``0s``) -> seconds."""
    parts = re.findall(r"(\d+)(h|m|s)", str(text))
    assert parts and "".join(a + b for a, b in parts) == str(text), text
    return sum(int(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_every_expected_annotation_is_literal_text():
    seen = 0
    for name, doc in DOCS.items():
        for t in doc["tests"]:
            for check in t.get("alert_rule_test") or []:
                for exp in check.get("exp_alerts") or []:
                    for key, text in (exp.get("exp_annotations") or {}).items():
                        assert isinstance(text, str) and "{{" not in text and "$value" not in text, (name, key, text)
                        seen += 1
    assert seen > 100


def test_nothing_generates_the_promtool_tests():
    from omniwatch import generated
    assert not [p for p in generated.expected(k8s=False) if p.parent == TESTS]
    for name in DOCS:
        assert "generated" not in (TESTS / name).read_text().lower(), name


def _checks() -> dict[str, list[tuple[int, dict[int, bool]]]]:
    """alertname -> per test: (the file's evaluation interval, eval_time -> expects an alert there)."""
    out: dict[str, list[tuple[int, dict[int, bool]]]] = {}
    for doc in DOCS.values():
        every = seconds(doc.get("evaluation_interval", "1m"))
        for t in doc["tests"]:
            per: dict[str, dict[int, bool]] = {}
            for c in t.get("alert_rule_test") or []:
                per.setdefault(c["alertname"], {})[seconds(c["eval_time"])] = bool(c.get("exp_alerts"))
            for alert, times in per.items():
                out.setdefault(alert, []).append((every, times))
    return out


@pytest.mark.parametrize("alert", sorted({a.name for a in rules.load_alerts()}))
def test_every_alert_is_checked_just_before_and_just_after_its_for(alert):
    """Some test sees the alert quiet at one evaluation and firing at the next (an alert without ``for:``: quiet
    before, firing after); Watchdog fires from the first evaluation."""
    checks = _checks().get(alert, [])
    assert any(any(times.values()) for _, times in checks), f"{alert}: no test expects it to fire"
    if alert == "Watchdog":
        return
    has_for = any(a.for_ for a in rules.load_alerts() if a.name == alert)
    pairs = [(t, t2) for every, times in checks for t, quiet in times.items() for t2, fires in times.items()
             if not quiet and fires and (t2 - t == every or (not has_for and t2 > t))]
    assert pairs, f"{alert}: no test sees it quiet one evaluation before it fires"


# --- the tests bite -------------------------------------------------------------------------------------------
# Each threshold, window and for: of the omniwatch.rules.yml alerts, loosened (the alert fires later or not at all),
# and the alert whose literal tests must then fail.
LOOSENED = {
    "step_for": ("2m", "RewardBoundRollout"),
    "reward_bound.ratio": (0.6, "RewardBoundRollout"),
    "reward_bound.step_share": (0.45, "RewardBoundRollout"),
    "inter_stage_idle.ratio": (0.3, "InterStageIdleGPU"),
    "mfu.impossible": (3.0, "MFUImpossible"),
    "mfu.drop_ratio": (0.4, "MFUDrop"),
    "mfu.floor": (0.001, "MFUImplausiblyLow"),
    "step_time.regression_ratio": (1.6, "StepTimeRegression"),
    "step_drift.ratio": (1.6, "StepTimeRegression"),
    "step_time.median_ratio": (1.35, "StepTimeRegression"),
    "step_time.part_share": (0.2, "StepTimeRegression"),
    "mfu.drift_ratio": (0.8, "MFUDrop"),
    "workload.change": (1.5, "WorkloadChanged"),
    # a resolve threshold loosened (the held alert resolves sooner): the test of it held just past it fails
    "reward_bound.resolve_ratio": (0.33, "RewardBoundRollout"),
    "reward_bound.resolve_step_share": (0.4, "RewardBoundRollout"),
    "inter_stage_idle.resolve_ratio": (0.075, "InterStageIdleGPU"),
    "mfu.impossible_resolve": (0.97, "MFUImpossible"),
    "mfu.drop_resolve": (0.9, "MFUDrop"),
    "mfu.floor_resolve": (0.055, "MFUImplausiblyLow"),
    "step_time.resolve_ratio": (1.1, "StepTimeRegression"),
    "step_time.part_resolve": (0.06, "StepTimeRegression"),
    "reward_saturation.resolve": (0.42, "RewardSaturation"),
    "straggler.resolve": (2.1, "RolloutStraggler"),
    "rollout_rejection.resolve": (0.035, "RolloutRejectionHigh"),
    "outside_step.resolve": (0.075, "TimeOutsideStep"),
    "timer_overlap.resolve": (0.006, "TimersExceedStep"),
    "reward_saturation.zero_std_ratio": (0.97, "RewardSaturation"),
    "stall.notice_steps": (5, "TrainingStalled"),
    "stall.unseen_planned_steps": (8, "TrainingStalled"),
    "stall.critical_extra_steps": (6, "TrainingStalled"),
    "stall.early_warning_warmups": (2.5, "TrainingStalled"),
    "stall.early_critical_warmups": (3.5, "TrainingStalled"),
    "stall.early_unseen_planned_warmups": (4, "TrainingStalled"),
    "gpu_memory.ratio": (0.99, "GPUMemoryNearFull"),
    "gpu_memory.for": ("10m", "GPUMemoryNearFull"),
    "source_down.for": ("5m", "OmniwatchSourceDown"),
    "straggler.ratio": (4.0, "RolloutStraggler"),
    "rank_straggler.spread": (2.5, "RankStraggler"),
    "rank_straggler.dispatches": (5, "RankStraggler"),
    "grad_norm.nonfinite_steps": (30, "GradNormNonFinite"),
    "rollout_rejection.seq_masked_fraction": (0.2, "RolloutRejectionHigh"),
    "outside_step.ratio": (0.3, "TimeOutsideStep"),
    "timer_overlap.tolerance": (0.1, "TimersExceedStep"),
}


def _last_eval(test: dict) -> int:
    return max(seconds(c["eval_time"]) for c in (test.get("alert_rule_test") or []) + (test.get("promql_expr_test") or []))


def only(rules_text: str, alert: str) -> str:
    """``rules_text`` with only ``alert``'s rules and the recording rules they read (transitively), for a mutation run
    of ``cut(..., alone=True)``: promtool evaluates every rule at every step, so the 64 rules of the file cost three
    times the few an alert reads (TrainingStalled's tests: 13 s -> 5 s of CPU per mutation)."""
    doc = yaml_load(rules_text)
    rules_ = [r for g in doc["groups"] for r in g["rules"]]
    exprs = {r["record"]: r["expr"] for r in rules_ if "record" in r}
    need: set[str] = set()
    todo = [r["expr"] for r in rules_ if r.get("alert") == alert]
    assert todo, alert
    while todo:
        expr = todo.pop()
        for name, body in exprs.items():
            if name not in need and re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr):
                need.add(name)
                todo.append(body)
    doc["groups"] = [{**g, "rules": kept} for g in doc["groups"]
                     if (kept := [r for r in g["rules"] if r.get("alert") == alert or r.get("record") in need])]
    return yaml.safe_dump(doc, sort_keys=False, width=10**9)


def cut(alert: str, tmp: Path, rule_file: str = "omniwatch.rules.yml", shortest: bool = False,
        alone: bool = False) -> list[Path]:
    """The literal tests of ``rule_file`` that expect ``alert`` to fire (a looser rule fires later, less or not at
    all; a changed word no longer matches), one file per test file: promtool runs only what can catch the change.
    ``shortest``: only the test that evaluates least (a changed word fails every test that expects the alert).
    ``alone``: only the checks of ``alert`` itself (for a rule file cut by :func:`only`)."""
    out = []
    if shortest:
        best = min(((_last_eval(t), name, t) for name, src in DOCS.items() if src["rule_files"] == [f"../{rule_file}"]
                    for t in src["tests"] if any(c["alertname"] == alert and c.get("exp_alerts")
                                                 for c in t.get("alert_rule_test") or [])), key=lambda x: x[0])
    for name, src in DOCS.items():
        if src["rule_files"] != [f"../{rule_file}"]:
            continue
        tests = [t for t in src["tests"] if any(c["alertname"] == alert and c.get("exp_alerts")
                                                for c in t.get("alert_rule_test") or [])]
        if shortest:
            tests = [t for t in tests if t is best[2]]
        if alone:
            tests = [{**{k: v for k, v in t.items() if k != "promql_expr_test"},
                      "alert_rule_test": [c for c in t["alert_rule_test"] if c["alertname"] == alert]} for t in tests]
        if tests:
            path = tmp / "alerts" / "tests" / f"cut_{alert}_{name}"
            path.write_text(yaml.safe_dump({**src, "tests": tests}, sort_keys=False, width=10**9))
            out.append(path)
    assert out, alert
    return out


@functools.lru_cache(maxsize=None)
def logic_of(overrides: tuple) -> str:
    """omniwatch.rules.yml with the expressions and for: of the overridden config and every annotation as the
    default renders it: only behaviour differs, so only behaviour can fail a test."""
    cfg = DEFAULT
    for path, value in overrides:
        if "." in path:
            section, field = path.split(".")
            part = getattr(cfg, section)
            name = next(n for n, f in type(part).model_fields.items() if (f.alias or n) == field)
            cfg = cfg.model_copy(update={section: part.model_copy(update={name: value})})
        else:
            cfg = cfg.model_copy(update={path: value})
    [default] = [f for f in rulespec.rule_files(DEFAULT) if f.name == "omniwatch.rules.yml"]
    [tuned] = [f for f in rulespec.rule_files(cfg) if f.name == "omniwatch.rules.yml"]
    doc = yaml_load(render.render_file(default, DEFAULT))
    logic = yaml_load(render.render_file(tuned, cfg))
    for group, lgroup in zip(doc["groups"], logic["groups"], strict=True):
        for rule, lrule in zip(group["rules"], lgroup["rules"], strict=True):
            rule["expr"] = lrule["expr"]
            if "for" in lrule:
                rule["for"] = lrule["for"]
    return yaml.safe_dump(doc, sort_keys=False, width=10**9)


def test_the_loosened_paths_are_config_thresholds():
    """Every path above is a threshold, window or for: of the config (a new alert may add its own line)."""
    skip = {"selectors", "window", "runbook_base", "rollout_queue", "transferqueue", "reward_server",
            "stall.provisional_factor", "stall.checkpoint_write_idle_steps", "stall.history_steps", "run_cap.window"}
    fields = set()
    for name, f in type(DEFAULT).model_fields.items():
        label = f.alias or name
        value = getattr(DEFAULT, name)
        if label in skip:
            continue
        if isinstance(value, config._Part):
            fields |= {f"{label}.{ff.alias or nn}" for nn, ff in type(value).model_fields.items()} - skip
        else:
            fields.add(label)
    assert set(LOOSENED) <= fields, set(LOOSENED) - fields
    assert len(LOOSENED) >= 23


def test_the_cut_tests_pass_on_the_default_rules(tmp_path):
    """logic_of(()) is the shipped rule file's behaviour: the cut files of a few alerts pass on it."""
    shutil.copytree(REPO / "alerts", tmp_path / "alerts")
    (tmp_path / "alerts" / "omniwatch.rules.yml").write_text(logic_of(()))
    files = [f for a in ("RewardBoundRollout", "RankStraggler", "OmniwatchSourceDown") for f in cut(a, tmp_path)]
    res = run([tool("promtool"), "test", "rules", *map(str, files)])
    assert res.returncode == 0, res.stdout + res.stderr
    # and each alert alone (the mutation runs' form): its rules and what they read, its own checks
    for alert in ("TrainingStalled", "StepTimeRegression", "MFUDrop"):
        (tmp_path / "alerts" / "omniwatch.rules.yml").write_text(only(logic_of(()), alert))
        res = run([tool("promtool"), "test", "rules", *map(str, cut(alert, tmp_path, alone=True))])
        assert res.returncode == 0, alert + "\n" + res.stdout + res.stderr


@pytest.mark.slow  # the mutation runs (promtool once per mutated rule file): make test, not the edit loop
@pytest.mark.parametrize("path", sorted(LOOSENED))
def test_the_literal_tests_catch_a_loosened_threshold(tmp_path, path):
    looser, alert = LOOSENED[path]
    rules_text = logic_of(((path, looser),))
    assert rules_text != logic_of(()), f"{path}: the rules do not read it"
    shutil.copytree(REPO / "alerts", tmp_path / "alerts")
    (tmp_path / "alerts" / "omniwatch.rules.yml").write_text(only(rules_text, alert))
    res = run([tool("promtool"), "test", "rules", *map(str, cut(alert, tmp_path, alone=True))])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "FAILED" in out and alert in out, f"{path}={looser}: the tests still pass\n{out}"


WORDING = [("omniwatch.rules.yml", "RewardBoundRollout", "description"),
           ("omniwatch.rules.yml", "TrainingStalled", "summary"),
           ("omniwatch.rules.yml", "RolloutStraggler", "remedy"),
           ("omniwatch.rules.yml", "GPUMemoryNearFull", "description"),
           ("endpoints.rules.yml", "RolloutQueueSaturated", "description"),
           ("endpoints.rules.yml", "TransferQueueBacklog", "remedy")]


@pytest.mark.slow
@pytest.mark.parametrize("rule_file, alert, key", WORDING)
def test_the_literal_tests_catch_a_wording_change(tmp_path, rule_file, alert, key):
    """One word of an alert's annotation changed in the rule file: a literal expectation no longer matches."""
    doc = yaml_load((REPO / "alerts" / rule_file).read_text())
    changed = 0
    for g in doc["groups"]:
        for r in g["rules"]:
            if r.get("alert") == alert and key in r["annotations"]:
                text = r["annotations"][key]
                # every "the" -> "a" (or every "a" -> "the"): whichever branch of the text a test renders
                new = (re.sub(r"\bthe\b", "a", text) if re.search(r"\bthe\b", text)
                       else re.sub(r"\ba\b", "the", text) if re.search(r"\ba\b", text) else text + " Check it.")
                assert new != text
                r["annotations"][key] = new
                changed += 1
    assert changed
    shutil.copytree(REPO / "alerts", tmp_path / "alerts")
    (tmp_path / "alerts" / rule_file).write_text(yaml.safe_dump(doc, sort_keys=False, width=10**9))
    res = run([tool("promtool"), "test", "rules", *map(str, cut(alert, tmp_path, rule_file, shortest=True))])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and alert in out and "FAILED" in out, out
