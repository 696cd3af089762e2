"""docs/contributing.md's walkthroughs, followed from a clean checkout (issue 34 item 5). "Add a signal and its alert":
a clone of this commit gets a throwaway window signal and its alert ("reward mean fell below 0.7 x the run's
reference") through the public declaration (core/signals.py). "Add an alert": a throwaway RayTaskPollSlow on a series
the exporter already has, in the six files that section names. Each edits exactly the files its table names (counted
with git: at most five for a signal); then `omniwatch generate`, promtool on every literal test, `generate --check` and
the quick-tier tests that police rules, prose, dashboards, runbooks, names and the state file pass in the clone. And
the quick tier catches an omission: with any one of those files left out, the same tests fail."""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, require_binary

# ~15 minutes of CPU in all (per walkthrough: generate twice, promtool on every rule test, the policing test modules in
# the clone; per omission: generate and those modules up to their first failure): `make test-long`
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


# --- "Add an alert": six files, followed with a throwaway RayTaskPollSlow on an existing series --------------
ALERT_NAME = 'ALERT_RAY_TASK_POLL_SLOW = "RayTaskPollSlow"\n'

ALERT_CONFIG = '''class RayTaskPoll(_Part):
    max_s: float = Field(5.0, description="RayTaskPollSlow: a poll of Ray's state API slower than this (wall seconds).")
    for_: str = Field("5m", alias="for", description="RayTaskPollSlow: how long every poll must be that slow.")


'''

ALERT_SPEC = '''        AlertSpec(n.ALERT_RAY_TASK_POLL_SLOW,
                  "max by (job, instance) (" + sel(c, n.RAY_TASK_POLL_SECONDS, 'kind="wall"') + f") > {c.ray_task_poll.max_s:g}",
                  "info", "Polls of Ray's state API are slow.",
                  P("Every poll of Ray's state API by the omniwatch exporter ", LabelIf("instance", "at ", " "),
                    f"took longer than {c.ray_task_poll.max_s:g} s for {c.ray_task_poll.for_}."), c.ray_task_poll.for_,
                  remedy=remedy("Raise --ray-tasks-interval or look at the Ray dashboard's load.", "Poll Ray less often")),
'''

ALERT_PROMTOOL_CASE = '''- name: RayTaskPollSlow fires after 5m of polls slower than 5 s and stays quiet for a fast exporter
  interval: 15s
  input_series:
  - series: omniwatch_ray_task_poll_seconds{job="omniwatch",instance="127.0.0.1:19095",kind="wall"}
    values: 1x1 8x30
  - series: omniwatch_ray_task_poll_seconds{job="omniwatch",instance="10.0.0.9:19095",kind="wall"}
    values: 1x31
  alert_rule_test:
  - eval_time: 5m15s
    alertname: RayTaskPollSlow
  - eval_time: 5m30s
    alertname: RayTaskPollSlow
    exp_alerts:
    - exp_labels:
        severity: info
        job: omniwatch
        instance: 127.0.0.1:19095
      exp_annotations:
        summary: Polls of Ray's state API are slow.
        description: Every poll of Ray's state API by the omniwatch exporter at 127.0.0.1:19095 took longer than 5 s for 5m.
        remedy: Raise --ray-tasks-interval or look at the Ray dashboard's load.
        action: Poll Ray less often
        runbook_url: http://127.0.0.1:19095/runbooks#raytaskpollslow
'''

ALERT_RUNBOOK = '''
## RayTaskPollSlow

**What it means.** Every poll of Ray's state API by the exporter took longer than 5 s for 5 minutes.

**Confirm.** The Worker lanes dashboard, row "Task-event source", panel "Poll cost".

**Fix.** Raise `--ray-tasks-interval` or look at the Ray dashboard's load.
'''

POLL_PANEL = '''(Target(f"max by (kind) ({n.RAY_TASK_POLL_SECONDS})", "{{kind}}"),), unit="s", min=0, w=8, scope="global"'''


def _insert(path: Path, anchor: str, text: str, after: bool = True) -> None:
    s = path.read_text()
    assert s.count(anchor) == 1, f"{path}: the anchor {anchor!r} moved"
    path.write_text(s.replace(anchor, anchor + text if after else text + anchor))


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _signal_edits(repo: Path) -> dict:
    """The signal walkthrough's five files, through the public declarations: file -> the edit."""
    ex = repo / "exporter" / "omniwatch"
    overview = ex / "dashboards" / "overview.py"

    def config() -> None:
        _insert(ex / "config.py", "class Config(_Part):", CONFIG_SECTION, after=False)
        _insert(ex / "config.py", "    reward_saturation: RewardSaturation = RewardSaturation()\n",
                "    reward_mean: RewardMean = RewardMean()\n")

    def panel() -> None:
        _insert(overview, "from ..core.signals import ZERO_STD", ", REWARD_MEAN")
        _insert(overview, 'show_thresholds="dashed+area", w=16, runbook=n.ALERT_REWARD_SATURATION),', PANEL)
    return {"exporter/omniwatch/core/signals.py": lambda: _append(ex / "core" / "signals.py", SIGNAL),
            "exporter/omniwatch/config.py": config,
            "alerts/tests/steps.test.yml": lambda: _append(repo / "alerts" / "tests" / "steps.test.yml", PROMTOOL_CASE),
            "docs/runbooks.md": lambda: _append(repo / "docs" / "runbooks.md", RUNBOOK),
            "exporter/omniwatch/dashboards/overview.py": panel}


def _alert_edits(repo: Path) -> dict:
    """The alert walkthrough's six files: file -> the edit."""
    ex = repo / "exporter" / "omniwatch"

    def config() -> None:
        _insert(ex / "config.py", "class Config(_Part):", ALERT_CONFIG, after=False)
        _insert(ex / "config.py", "    ray_task_events: RayTaskEvents = RayTaskEvents()\n",
                "    ray_task_poll: RayTaskPoll = RayTaskPoll()\n")
    return {"exporter/omniwatch/names.py": lambda: _insert(ex / "names.py", 'ALERT_RAY_TASK_EVENTS_LOST = "RayTaskEventsLost"\n',
                                                            ALERT_NAME),
            "exporter/omniwatch/config.py": config,
            "exporter/omniwatch/alerting/rulespec.py": lambda: _insert(
                ex / "alerting" / "rulespec.py", '        AlertSpec("Watchdog", "vector(1)",', ALERT_SPEC, after=False),
            "alerts/tests/health.test.yml": lambda: _append(repo / "alerts" / "tests" / "health.test.yml",
                                                            ALERT_PROMTOOL_CASE),
            "docs/runbooks.md": lambda: _append(repo / "docs" / "runbooks.md", ALERT_RUNBOOK),
            "exporter/omniwatch/dashboards/lanes.py": lambda: _insert(
                ex / "dashboards" / "lanes.py", POLL_PANEL, ", runbook=n.ALERT_RAY_TASK_POLL_SLOW")}


WALKTHROUGHS = {"signal": ("## Add a signal and its alert", _signal_edits, "RewardMeanLow"),
                "alert": ("## Add an alert", _alert_edits, "RayTaskPollSlow")}
# the quick-tier modules that police what a new alert touches, cheapest catch first (pytest -x stops at it)
POLICE = ("tests/test_generated.py", "tests/test_rules.py", "tests/test_promtool_literal.py",
          "tests/test_dashboards_iii.py", "tests/test_dashboards.py", "tests/test_names.py", "tests/test_catalogue.py",
          "tests/test_runbooks.py", "tests/test_step_record.py", "tests/test_state.py", "tests/test_remedies.py")


def _table(head: str) -> list[str]:
    """The files a walkthrough's table names, in order (placeholders such as <group> kept)."""
    text = (REPO / "docs" / "contributing.md").read_text()
    assert head in text, f"docs/contributing.md lost its {head!r} section"
    section = text[text.index(head):text.index("\n## ", text.index(head) + 5)]
    return re.findall(r"^\| \d+ \| `([^`]+)`", section, re.M)


def _clone(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(REPO), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", head], check=True)
    return repo


def _changed(repo: Path) -> set[str]:
    out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines()}


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo / "exporter")},
                          capture_output=True, text=True)


def _police(repo: Path) -> subprocess.CompletedProcess:
    return _run(repo, sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                "not integration and not long and not slow", *POLICE)


@pytest.mark.parametrize("kind", sorted(WALKTHROUGHS))
def test_the_walkthrough_as_contributing_md_says(kind, tmp_path):
    promtool = require_binary("promtool")
    head, edits_of, alert = WALKTHROUGHS[kind]
    repo = _clone(tmp_path)
    edits = edits_of(repo)
    for edit in edits.values():
        edit()
    edited = _changed(repo)
    table = _table(head)
    assert edited == set(edits), sorted(edited)
    assert len(edited) == len(table) <= {"signal": 5, "alert": 6}[kind], (sorted(edited), table)
    for pattern in table:
        assert any(fnmatch.fnmatch(f, re.sub(r"<[^>]+>", "*", pattern)) for f in edited), (pattern, sorted(edited))

    gen = _run(repo, sys.executable, "-m", "omniwatch", "generate")
    assert gen.returncode == 0, gen.stdout[-3000:] + gen.stderr[-3000:]
    generated = _changed(repo) - edited
    rules = "".join(p.read_text() for p in (repo / "alerts").glob("*.rules.yml"))
    assert f"alert: {alert}" in rules
    if kind == "signal":
        assert "record: project_experiment:omniwatch_reward_mean:max_k" in rules
        assert "docs/metrics.md" in generated, sorted(generated)
    assert "alerts/omniwatch.rules.yml" in generated and "docs/alerts.md" in generated, sorted(generated)
    tests = sorted(str(p.relative_to(repo)) for p in (repo / "alerts" / "tests").glob("*.test.yml"))
    prom = _run(repo, promtool, "test", "rules", *tests)
    assert prom.returncode == 0, prom.stdout[-4000:] + prom.stderr[-2000:]
    check = _run(repo, sys.executable, "-m", "omniwatch", "generate", "--check")
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    quick = _police(repo)
    assert quick.returncode == 0, quick.stdout[-6000:] + quick.stderr[-2000:]


OMISSIONS = [(kind, f) for kind in sorted(WALKTHROUGHS) for f in WALKTHROUGHS[kind][1](Path("."))]


@pytest.mark.parametrize("kind,left_out", OMISSIONS, ids=[f"{k}-{Path(f).name}" for k, f in OMISSIONS])
def test_the_quick_tier_catches_a_file_left_out(kind, left_out, tmp_path):
    """Every file of the table is needed: the walkthrough with one of them left out (then `omniwatch generate`, as
    the walkthrough says) fails the quick-tier tests that police it."""
    repo = _clone(tmp_path)
    for f, edit in WALKTHROUGHS[kind][1](repo).items():
        if f != left_out:
            edit()
    _run(repo, sys.executable, "-m", "omniwatch", "generate")   # may fail itself: the tests then see the drift
    quick = _police(repo)
    assert quick.returncode in (1, 2) and re.search(r"^(FAILED|ERROR) ", quick.stdout, re.M), \
        f"left out {left_out} and the quick tier passed:\n{quick.stdout[-3000:]}"
    # and what fails names the alert, its signal or its config section (the walkthrough with all files passes)
    said = (quick.stdout + quick.stderr).lower().replace("_", "")
    assert any(w in said for w in ("raytaskpoll", "rewardmean")), quick.stdout[-3000:]
