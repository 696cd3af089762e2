"""docs/contributing.md's "Add a signal and its alert", followed from a clean checkout (issue 34 item 5): a clone of
this commit gets a throwaway window signal and its alert ("reward mean fell below 0.7 x the run's reference") through
the public declaration (core/signals.py), exactly in the files the walkthrough's table names; then `omniwatch generate`,
promtool on the literal tests and the quick-tier tests that police rules, dashboards, names and the state file run
in the clone. The hand-edited files are counted (git) and must be the table's, at most five."""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, require_binary

# ~300 s of CPU (generate twice, promtool on every rule test, eight test modules in the clone): `make test-long`
pytestmark = [pytest.mark.slow, pytest.mark.long]

SIGNAL = '''

REWARD_MEAN = signal(
    "reward_mean", "critic/rewards/mean", "verl_omni_metrics.md (critic/rewards/*)",
    help="min/median/max of critic/rewards/mean over the last k normal steps (a throwaway walkthrough signal).",
    reference_help="The median critic/rewards/mean of the run's reference steps.", unit="",
    rule=SignalAlert(
        "RewardMeanLow", "warning", "The reward mean fell well below the run's reference.",
        "{run}: critic/rewards/mean was at most {value} in every one of the last {k} normal steps, under {threshold} x "
        "the run's reference{at_step}.",
        ("max", "<", "reward_mean.ratio"), ("<", "reward_mean.resolve"),
        ("Compare the reward model and the latest prompts with the reference steps'.", "Check the reward model"),
        of_reference=True, fmt="f2", record_comment="The reward mean, highest over the window."))
SIGNALS += (REWARD_MEAN,)
'''

CONFIG_SECTION = '''class RewardMean(_Part):
    ratio: float = Field(0.7, description="RewardMeanLow: the window's highest reward mean under this x the run's reference.")
    resolve: float = Field(0.8, description="Hysteresis: RewardMeanLow stays while the window median is under this x the reference.")


'''

_RUN = 'job="omniwatch",instance="127.0.0.1:19095",project="p",experiment="rm"'
PROMTOOL_CASE = f'''- name: RewardMeanLow fires when every window step's reward mean is under 0.7 x the reference
  interval: 15s
  input_series:
  - series: omniwatch_reward_mean_window{{{_RUN},stat="max"}}
    values: 0.9x3 0.5x5
  - series: omniwatch_reward_mean_window{{{_RUN},stat="median"}}
    values: 0.9x3 0.5x5
  - series: omniwatch_reward_mean_reference{{{_RUN}}}
    values: 1x8
  - series: omniwatch_step{{{_RUN}}}
    values: 200+1x9
  - series: omniwatch_window_steps{{{_RUN}}}
    values: 3x9
  alert_rule_test:
  - eval_time: 1m
    alertname: RewardMeanLow
  - eval_time: 1m15s
    alertname: RewardMeanLow
    exp_alerts:
    - exp_labels:
        severity: warning
        persistence: steps
        project: p
        experiment: rm
      exp_annotations:
        summary: The reward mean fell well below the run's reference.
        description: 'p/rm: critic/rewards/mean was at most 0.50 in every one of the last 3 normal steps, under 0.7 x the run''s reference, at step 205.'
        step: '205'
        remedy: 'Compare the reward model and the latest prompts with the reference steps''.'
        action: Check the reward model
        runbook_url: http://127.0.0.1:19095/runbooks#rewardmeanlow
'''

RUNBOOK = '''
## RewardMeanLow

**What it means.** Every step of the window logged a `critic/rewards/mean` under 0.7 x the run's reference.

**Confirm.** The overview's "Reward mean against the reference" panel.

**Fix.** Compare the reward model and the latest prompts with the reference steps'.
'''

PANEL = '''
        Panel("Reward mean against the reference", "RewardMeanLow: the window's highest reward mean over the run's reference.",
              (Target(f"{sel(REWARD_MEAN.record('max'))} / on (project, experiment) max by (project, experiment) "
                      f"({sel(REWARD_MEAN.reference)})", EXP + " window max / reference"),),
              min=0, thresholds=(Step(None, "red"), cfg_step(cfg, "reward_mean.ratio", "green")), w=24,
              runbook="RewardMeanLow"),'''


def _insert(path: Path, anchor: str, text: str, after: bool = True) -> None:
    s = path.read_text()
    assert s.count(anchor) == 1, f"{path}: the anchor {anchor!r} moved"
    path.write_text(s.replace(anchor, anchor + text if after else text + anchor))


def _table() -> list[str]:
    """The files the walkthrough's table names, in order (placeholders such as <group> kept)."""
    text = (REPO / "docs" / "contributing.md").read_text()
    head = "## Add a signal and its alert"
    assert head in text, "docs/contributing.md lost its 'Add a signal and its alert' section"
    section = text[text.index(head):text.index("\n## ", text.index(head) + 5)]
    return re.findall(r"^\| \d+ \| `([^`]+)`", section, re.M)


def test_add_a_signal_and_its_alert_as_contributing_md_says(tmp_path):
    promtool = require_binary("promtool")
    repo = tmp_path / "repo"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(REPO), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", head], check=True)
    ex = repo / "exporter" / "omniwatch"
    # the walkthrough's five files, through the public declarations
    (ex / "core" / "signals.py").write_text((ex / "core" / "signals.py").read_text() + SIGNAL)
    _insert(ex / "config.py", "class Config(_Part):", CONFIG_SECTION, after=False)
    _insert(ex / "config.py", "    reward_saturation: RewardSaturation = RewardSaturation()\n",
            "    reward_mean: RewardMean = RewardMean()\n")
    steps = repo / "alerts" / "tests" / "steps.test.yml"
    steps.write_text(steps.read_text() + PROMTOOL_CASE)
    runbooks = repo / "docs" / "runbooks.md"
    runbooks.write_text(runbooks.read_text() + RUNBOOK)
    _insert(ex / "dashboards" / "overview.py", "from ..core.signals import ZERO_STD", ", REWARD_MEAN")
    _insert(ex / "dashboards" / "overview.py", 'show_thresholds="dashed+area", w=16, runbook=n.ALERT_REWARD_SATURATION),',
            PANEL)

    def changed() -> set[str]:
        out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                             capture_output=True, text=True, check=True).stdout
        return {line[3:] for line in out.splitlines()}
    edited = changed()
    table = _table()
    assert len(edited) == len(table) <= 5, (sorted(edited), table)
    for pattern in table:
        assert any(fnmatch.fnmatch(f, re.sub(r"<[^>]+>", "*", pattern)) for f in edited), (pattern, sorted(edited))

    env = {**os.environ, "PYTHONPATH": str(repo / "exporter")}
    run = dict(cwd=repo, env=env, capture_output=True, text=True)
    gen = subprocess.run([sys.executable, "-m", "omniwatch", "generate"], **run)
    assert gen.returncode == 0, gen.stdout[-3000:] + gen.stderr[-3000:]
    generated = changed() - edited
    rules = (repo / "alerts" / "omniwatch.rules.yml").read_text()
    assert "alert: RewardMeanLow" in rules and "record: project_experiment:omniwatch_reward_mean:max_k" in rules
    assert "alerts/omniwatch.rules.yml" in generated and "docs/metrics.md" in generated, sorted(generated)
    tests = sorted(str(p.relative_to(repo)) for p in (repo / "alerts" / "tests").glob("*.test.yml"))
    prom = subprocess.run([promtool, "test", "rules", *tests], **run)
    assert prom.returncode == 0, prom.stdout[-4000:] + prom.stderr[-2000:]
    check = subprocess.run([sys.executable, "-m", "omniwatch", "generate", "--check"], **run)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    # the quick-tier tests that police what a new signal and alert touch (rules, prose, dashboards, names, state)
    quick = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                            "not integration and not long and not slow", "tests/test_rules.py",
                            "tests/test_promtool_literal.py", "tests/test_dashboards.py", "tests/test_names.py",
                            "tests/test_catalogue.py", "tests/test_step_record.py", "tests/test_state.py",
                            "tests/test_remedies.py"], **run)
    assert quick.returncode == 0, quick.stdout[-6000:] + quick.stderr[-2000:]
