"""alerts/alertmanager.yml's inhibit rules, checked in a real Alertmanager on loopback: alerts are
POSTed to /api/v2/alerts with the labels the rule files give them, and /api/v2/alerts must show the
right ones suppressed (TrainingStalled past its planned work silences the step-based alerts of its run
only, its stages silence each other, a cause's alert
silences StepTimeRegression only when the regression's `cause` is its own, critical silences warning,
MFUImpossible does not silence MFUDrop)."""
from __future__ import annotations

import datetime as dt
import re
import subprocess
import time

import httpx
import pytest
import yaml

from omniwatch import names, rules

from .conftest import free_port, require_tool as tool, stop_process
from omniwatch.yamlio import load as yaml_load

pytestmark = pytest.mark.integration

ALERTS = rules.load_alerts()


def render_config(tmp_path) -> str:
    """The repo config as `omniwatch up` renders it: same routes and inhibit rules, the webhook url
    and credentials file rewritten (here to a closed loopback port and a tmp file)."""
    cfg = yaml_load(rules.alertmanager_config_path().read_text())
    hook = next(r for r in cfg["receivers"] if r["name"] == "omniwatch")["webhook_configs"][0]
    hook["url"] = f"http://127.0.0.1:{free_port()}/api/v1/alertmanager"
    cred = tmp_path / "webhook.token"
    cred.write_text("test-token\n")
    hook["http_config"]["authorization"]["credentials_file"] = str(cred)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    binary = tool("prometheus-alertmanager", "alertmanager")
    tmp = tmp_path_factory.mktemp("am")
    port = free_port()
    log = open(tmp / "alertmanager.log", "w")
    proc = subprocess.Popen(
        [binary, f"--config.file={render_config(tmp)}", f"--storage.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            for _ in range(100):  # up to ~20 s
                if proc.poll() is not None:
                    pytest.fail(f"alertmanager exited {proc.returncode}: {(tmp / 'alertmanager.log').read_text()}")
                try:
                    if client.get("/-/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            else:
                pytest.fail("alertmanager did not become ready")
            yield client
    finally:
        stop_process(proc, 10)
        log.close()


def rule_labels(alertname: str, severity: str | None = None) -> dict:
    """The static labels the rule files give an alert (so a label removed there breaks this test)."""
    for a in ALERTS:
        if a.name == alertname and (severity is None or a.labels.get("severity") == severity):
            return {k: str(v) for k, v in a.labels.items()} | {"alertname": alertname}
    raise AssertionError(f"no alert {alertname} ({severity}) in the rule files")


def post(client: httpx.Client, *alerts: dict) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    body = [{"labels": a, "annotations": {"summary": "test."},
             "startsAt": now.isoformat(), "endsAt": (now + dt.timedelta(hours=1)).isoformat()} for a in alerts]
    r = client.post("/api/v2/alerts", json=body)
    assert r.status_code == 200, r.text


def states(client: httpx.Client, experiment: str, expected: dict[str, str]) -> dict[str, str]:
    """alertname -> state for one run, polled (bounded) until it equals ``expected``; the inhibitor
    learns source alerts asynchronously."""
    got: dict[str, str] = {}
    for _ in range(50):  # up to ~10 s
        r = client.get("/api/v2/alerts", params={"filter": f'experiment="{experiment}"'})
        assert r.status_code == 200, r.text
        got = {a["labels"]["alertname"] + ("/" + a["labels"]["severity"] if experiment == "-" else ""):
               a["status"]["state"] for a in r.json()}
        if got == expected:
            break
        time.sleep(0.2)
    return got


def run_labels(experiment: str, **extra) -> dict:
    return {names.L_PROJECT: "flowgrpo", names.L_EXPERIMENT: experiment, **extra}


def test_mfu_impossible_does_not_hide_a_real_mfu_drop(alertmanager):
    """A constant wrong peak cancels out in window max / baseline: a drop on a relabeled GPU is real."""
    post(alertmanager,
         rule_labels(names.ALERT_MFU_IMPOSSIBLE) | run_labels("l20x", role="actor"),
         rule_labels(names.ALERT_MFU_DROP) | run_labels("l20x", role="actor"))
    want = {names.ALERT_MFU_IMPOSSIBLE: "active", names.ALERT_MFU_DROP: "active"}
    assert states(alertmanager, "l20x", want) == want


def test_training_stalled_inhibits_step_alerts_of_its_run_only(alertmanager):
    step_alerts = sorted({a.name for a in ALERTS if a.labels.get("persistence") == "steps"})
    assert len(step_alerts) >= 6
    post(alertmanager, rule_labels(names.ALERT_STALLED, "critical") | run_labels("stalled"),
         *(rule_labels(n) | run_labels("stalled", role="actor") for n in step_alerts),
         rule_labels(names.ALERT_REWARD_BOUND) | run_labels("still_running"))
    want = {names.ALERT_STALLED: "active"} | {n: "suppressed" for n in step_alerts}
    assert states(alertmanager, "stalled", want) == want
    assert states(alertmanager, "still_running", {names.ALERT_REWARD_BOUND: "active"}) == \
        {names.ALERT_REWARD_BOUND: "active"}


def test_training_stalled_stages_inhibit_each_other_and_only_warning_up_silences_step_alerts(alertmanager):
    """TrainingStalled's info stage is planned work that may be running (a checkpoint): a standing
    step-based alert of the run stays; its warning stage silences them and the info notice; its
    critical stage silences the warning."""
    post(alertmanager, rule_labels(names.ALERT_STALLED, "info") | run_labels("checkpointing"),
         rule_labels(names.ALERT_REWARD_BOUND) | run_labels("checkpointing"))
    want = {names.ALERT_STALLED: "active", names.ALERT_REWARD_BOUND: "active"}
    assert states(alertmanager, "checkpointing", want) == want

    def stage_states(experiment: str, expected: dict) -> dict:
        got: dict = {}
        for _ in range(50):  # up to ~10 s: the inhibitor learns source alerts asynchronously
            r = alertmanager.get("/api/v2/alerts", params={"filter": f'experiment="{experiment}"'})
            assert r.status_code == 200, r.text
            got = {a["labels"]["alertname"] + "/" + a["labels"]["severity"]: a["status"]["state"] for a in r.json()}
            if got == expected:
                break
            time.sleep(0.2)
        return got

    post(alertmanager, *(rule_labels(names.ALERT_STALLED, sev) | run_labels("hung_warning") for sev in ("info", "warning")),
         rule_labels(names.ALERT_REWARD_BOUND) | run_labels("hung_warning"))
    want = {"TrainingStalled/info": "suppressed", "TrainingStalled/warning": "active",
            "RewardBoundRollout/warning": "suppressed"}
    assert stage_states("hung_warning", want) == want
    post(alertmanager, *(rule_labels(names.ALERT_STALLED, sev) | run_labels("hung") for sev in ("info", "warning", "critical")))
    want = {"TrainingStalled/info": "suppressed", "TrainingStalled/warning": "suppressed",
            "TrainingStalled/critical": "active"}
    assert stage_states("hung", want) == want


@pytest.mark.parametrize("cause_alert, cause", [(names.ALERT_REWARD_BOUND, "reward"), (names.ALERT_IDLE, "inter_stage_idle"),
                                               (names.ALERT_MFU_DROP, "actor"), (names.ALERT_STRAGGLER, "rollout")])
def test_a_cause_inhibits_step_time_regression_only_while_it_explains_it(alertmanager, cause_alert, cause):
    """StepTimeRegression names the part of the step that grew (`cause`): the cause's alert silences it,
    an unrelated regression (update_actor grew while reward-bound) still reports, and so does one whose
    cause has no alert firing."""
    exp = f"explained_{cause}"
    extra = {"role": "actor"} if cause_alert == names.ALERT_MFU_DROP else {}
    other = "actor" if cause != "actor" else "rollout"
    post(alertmanager, rule_labels(cause_alert) | run_labels(exp, **extra),
         rule_labels(names.ALERT_STEP_REGRESSION) | run_labels(exp, cause=cause),
         rule_labels(cause_alert) | run_labels(f"unrelated_{cause}", **extra),
         rule_labels(names.ALERT_STEP_REGRESSION) | run_labels(f"unrelated_{cause}", cause=other),
         rule_labels(names.ALERT_STEP_REGRESSION) | run_labels(f"alone_{cause}", cause=cause))
    want = {cause_alert: "active", names.ALERT_STEP_REGRESSION: "suppressed"}
    assert states(alertmanager, exp, want) == want
    want = {cause_alert: "active", names.ALERT_STEP_REGRESSION: "active"}
    assert states(alertmanager, f"unrelated_{cause}", want) == want
    assert states(alertmanager, f"alone_{cause}", {names.ALERT_STEP_REGRESSION: "active"}) == \
        {names.ALERT_STEP_REGRESSION: "active"}


def test_critical_inhibits_warning_of_the_same_alert(alertmanager):
    """Exporter scrape down (critical) hides the per-source warning; both lack run labels, so the
    run is the empty one: experiment="-" tags them here for the filter."""
    post(alertmanager, rule_labels("OmniwatchSourceDown", "critical") | {"job": "omniwatch", "experiment": "-"},
         rule_labels("OmniwatchSourceDown", "warning") | {"job": "omniwatch", "experiment": "-",
                                                          "source": "jsonl", "target": "/runs/a.jsonl"})
    want = {"OmniwatchSourceDown/critical": "active", "OmniwatchSourceDown/warning": "suppressed"}
    assert states(alertmanager, "-", want) == want


def test_watchdog_is_routed_to_the_omniwatch_receiver(alertmanager):
    post(alertmanager, rule_labels("Watchdog"))
    r = alertmanager.get("/api/v2/alerts", params={"filter": 'alertname="Watchdog"'})
    assert [(a["status"]["state"], [x["name"] for x in a["receivers"]]) for a in r.json()] == [("active", ["omniwatch"])]


def test_inhibit_rules_only_name_alerts_that_exist():
    text = rules.alertmanager_config_path().read_text()
    named = set()
    for m in re.findall(r'alertname\s*=~?\s*"([^"]+)"', text):
        named |= set(m.split("|"))
    assert named, "no alertname matchers found"
    assert named <= {a.name for a in ALERTS}, named - {a.name for a in ALERTS}
