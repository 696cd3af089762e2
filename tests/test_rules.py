"""alerts/ is valid, tested, documented and in sync: promtool/amtool accept it, the promtool unit tests
pass (and fail when a threshold is broken), every alert carries the annotations people act on, every
runbook link lands on a heading, and every omniwatch metric name exists in the catalogue; the files are
what ``omniwatch rules generate`` renders from the alert configuration."""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from omniwatch import names, rules
from omniwatch.config import DEFAULT

from .conftest import require_tool as tool

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ALERTS = rules.load_alerts()
SEVERITIES = {"critical", "warning", "info"}


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def cli(*argv: str) -> int:
    """``omniwatch rules ...`` through this module's own parser (other areas' commands not needed)."""
    p = argparse.ArgumentParser()
    rules.add_commands(p.add_subparsers(dest="command"))
    args = p.parse_args(list(argv))
    return args.func(args)


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --- the files are where the package looks for them ------------------------------------------------
def test_rules_dir_is_the_repo_alerts_dir():
    assert rules.RULES_DIR == REPO / "alerts"
    assert REPO / "alerts" / "omniwatch.rules.yml" in rules.rule_files()
    assert rules.alertmanager_config_path().is_file()


# --- external checkers -------------------------------------------------------------------------------
def test_promtool_check_rules_with_all_lints():
    res = run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", *map(str, rules.rule_files())])
    assert res.returncode == 0, res.stdout + res.stderr


def test_amtool_accepts_alertmanager_config():
    res = run([tool("amtool"), "check-config", str(rules.alertmanager_config_path())])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.timeout(900)
def test_rules_check_command_passes(capsys):
    """``omniwatch rules check``: promtool check rules (syntax + lint), every promtool unit test of alerts/tests/
    in one promtool run (the literal tests pass on the shipped rules), amtool check-config. It is the only run of
    the whole promtool suite in ``make test`` (a second one cost ~20 s of a core)."""
    tool("promtool"), tool("amtool")
    tests = rules.rule_test_files()
    assert len(tests) >= 8, tests
    cmds = rules.check_commands()
    assert [c[3:] for c in cmds if c[1:3] == ["test", "rules"]] == [list(map(str, tests))]
    # on a batch worker (nice 10, make test) beside the live stacks the suite can take minutes: the test bounds it
    rc = cli("rules", "check", "--timeout", "600")
    out = capsys.readouterr()
    assert rc == 0, (out.out + out.err)[-4000:]   # promtool's own words: which test, which alert, got vs expected
    assert "SUCCESS" in out.out + out.err and "FAILED" not in out.out + out.err


def test_rules_check_names_the_install_command_when_tools_are_missing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rules.RulesError, match="apt-get install prometheus prometheus-alertmanager"):
        rules.check_commands()
    assert cli("rules", "check") == 2
    assert "apt-get install prometheus prometheus-alertmanager" in capsys.readouterr().err


# --- what every alert must carry ----------------------------------------------------------------------
@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: f"{a.name}-{a.labels.get('severity')}")
def test_alert_has_severity_summary_description_and_runbook(alert):
    sev = alert.labels.get("severity")
    assert sev in (SEVERITIES | {"none"} if alert.name == "Watchdog" else SEVERITIES), sev
    assert alert.name != "Watchdog" or sev == "none"
    for key in ("summary", "description"):
        assert str(alert.annotations.get(key, "")).strip(), f"{alert.name} lacks {key}"
    assert alert.annotations["summary"].rstrip().endswith("."), "summary is a sentence ending with a period"
    assert alert.annotations.get("runbook_url") == DEFAULT.runbook_url(alert.name)
    assert alert.name[0].isupper() and " " not in alert.name


def test_step_alerts_use_window_series_and_are_marked_for_inhibition():
    """Alerts on step-window series carry persistence=steps (TrainingStalled inhibits them) and only
    absorb jitter with `for:`; persistence itself is counted in steps by the exporter."""
    step_alerts = [a for a in ALERTS if a.labels.get("persistence") == "steps"]
    assert {a.name for a in step_alerts} >= {names.ALERT_REWARD_BOUND, names.ALERT_IDLE, names.ALERT_MFU_IMPOSSIBLE,
                                             names.ALERT_MFU_DROP, "StepTimeRegression", "RewardSaturation"}
    for a in step_alerts:
        assert a.for_ == "15s", a.name
        # a window statistic, or an exporter series that is itself a window fact (every window step
        # reported MFU 0; skipped updates counted over the recent normal steps) or a device fact (the
        # GPU's name and memory; the median of the last 10 normal steps over the anchored reference; the window's
        # median images per step over the reference's), never a latest-step gauge
        assert re.search(r":(min|max)_k|omniwatch_mfu_unsupported|omniwatch_mfu_suspected_cause"
                         r"|omniwatch_grad_norm_nonfinite_recent_steps|omniwatch_step_duration_drift_ratio"
                         r"|omniwatch_workload_ratio", a.expr), \
            f"{a.name} must threshold a window statistic: {a.expr}"


def test_core_alerts_are_defined():
    assert set(names.CORE_ALERTS) <= {a.name for a in ALERTS}
    assert set(names.FAULT_TO_ALERT.values()) <= {a.name for a in ALERTS}


def test_every_runbook_link_opens_its_section_on_the_exporter():
    """runbook_url defaults to the exporter's own /runbooks (no internet needed): the page is served and
    every alert's anchor is a heading id on it."""
    from fastapi.testclient import TestClient
    from omniwatch.app import create_app
    from omniwatch.core.exposition import make_registry
    from omniwatch.core.model import RunStore
    from omniwatch.settings import Settings
    store = RunStore()
    page = TestClient(create_app(store, make_registry(store), Settings())).get("/runbooks")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    ids = set(re.findall(r'<h[1-4] id="([^"]+)"', page.text))
    missing = sorted({a.name for a in ALERTS if a.annotations["runbook_url"].rsplit("#", 1)[1] not in ids})
    assert not missing, f"docs/runbooks.md lacks '## <AlertName>' sections for {missing}"
    assert all(a.annotations["runbook_url"].startswith(DEFAULT.runbook_base + "#") for a in ALERTS)
    assert "<script" not in page.text


def test_every_alert_is_in_the_alerts_table():
    """The alert index of docs/alerts.md is rendered from the rules (no hand-written row needed): every alert
    has a row linking its runbook section."""
    text = (DOCS / "alerts.md").read_text()
    missing = sorted({a.name for a in ALERTS if f"| [`{a.name}`](runbooks.md#{a.name.lower()}) |" not in text})
    assert not missing, f"docs/alerts.md has no row for {missing}"


def test_metric_names_used_in_alerts_exist_in_the_catalogue():
    used = set()
    for f in sorted(rules.RULES_DIR.rglob("*.yml")):
        for tok in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", f.read_text()):
            if tok.startswith(names.PREFIX):  # recording-rule names contain ':' and start with their level
                used.add(tok)
    assert used, "no omniwatch_* names found at all"
    unknown = sorted(used - set(names.CATALOGUE))
    assert not unknown, f"not in omniwatch.names.CATALOGUE: {unknown}"


# --- generated from one configuration ---------------------------------------------------------------
def test_rules_generate_check_reports_no_drift(capsys):
    assert cli("rules", "generate", "--check") == 0, capsys.readouterr()


def test_a_hand_edit_of_a_generated_file_is_drift(tmp_path, capsys):
    from omniwatch import config
    from omniwatch.alerting import rulegen as generate
    out = tmp_path / "alerts"
    assert generate.generate(config.DEFAULT, out) != []          # first render writes everything
    assert generate.generate(config.DEFAULT, out, check=True) == []
    f = out / "omniwatch.rules.yml"
    f.write_text(f.read_text().replace("> 0.4", "> 0.6"))
    assert generate.generate(config.DEFAULT, out, check=True) == [f]


def test_a_tuned_config_renders_valid_rules_that_the_shipped_tests_reject(tmp_path):
    """Users tune a YAML copy of the thresholds: the rules and their prose follow it and promtool accepts them;
    the shipped promtool tests are literal (the default numbers and text), so they fail on the tuned rules."""
    cfg_file = tmp_path / "mine.yml"
    cfg_file.write_text("reward_bound: {ratio: 0.55, step_share: 0.25}\nmfu: {drop_ratio: 0.8}\n"
                        "gpu_memory: {ratio: 0.9, for: 10m}\nruns_book_typo: 1\n")
    assert cli("rules", "generate", "--config", str(cfg_file), "--out", str(tmp_path / "out")) == 2  # unknown key
    cfg_file.write_text("reward_bound: {ratio: 0.55, step_share: 0.25}\nmfu: {drop_ratio: 0.8}\n"
                        "gpu_memory: {ratio: 0.9, for: 10m}\n")
    assert cli("rules", "generate", "--config", str(cfg_file), "--out", str(tmp_path / "out")) == 0
    text = (tmp_path / "out" / "omniwatch.rules.yml").read_text()
    assert "omniwatch_reward_bound_ratio:min_k > 0.55" in text and "threshold 55%" in text
    assert "node_gpu:gpu_memory_used:ratio > 0.9" in text and "for: 10m" in text
    assert not (tmp_path / "out" / "tests").exists()
    res = run([tool("promtool"), "check", "rules", str(tmp_path / "out" / "omniwatch.rules.yml")])
    assert res.returncode == 0, res.stdout + res.stderr
    shutil.copytree(REPO / "alerts" / "tests", tmp_path / "out" / "tests")
    res = run([tool("promtool"), "test", "rules", str(tmp_path / "out" / "tests" / "steps.test.yml")])
    assert res.returncode != 0 and "RewardBoundRollout" in res.stdout + res.stderr


@pytest.mark.parametrize("content, why", [
    ("groups: [\n", "cannot read rule file"),
    ("", "no top-level 'groups'"),
    ("- just a list\n", "no top-level 'groups'"),
    (b"\xff\xfe\x00garbage", "cannot read"),
])
def test_bad_rule_files_are_clear_errors(tmp_path, content, why):
    f = tmp_path / "bad.rules.yml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(rules.RulesError, match=why) as e:
        rules.load_alerts(tmp_path)
    assert "bad.rules.yml" in str(e.value)
