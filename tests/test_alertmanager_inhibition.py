"""alerts/alertmanager.yml's inhibit rules, checked in a real Alertmanager on loopback: alerts are
POSTed to /api/v2/alerts with the labels the rule files give them, and /api/v2/alerts must show the
right ones suppressed (MFUImpossible silences MFUDrop, TrainingStalled silences the step-based
alerts of its run only, a named cause silences StepTimeRegression, critical silences warning)."""
from __future__ import annotations

import datetime as dt
import re
import subprocess
import time

import httpx
import pytest
import yaml

from omniwatch import names, rules

from .conftest import free_port, require_tool as tool

pytestmark = pytest.mark.integration

ALERTS = rules.load_alerts()


def render_config(tmp_path) -> str:
    """The repo config as `omniwatch up` renders it: same routes and inhibit rules, the webhook url
    and credentials file rewritten (here to a closed loopback port and a tmp file)."""
    cfg = yaml.safe_load(rules.alertmanager_config_path().read_text())
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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
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


def test_mfu_impossible_inhibits_mfu_drop_of_the_same_run(alertmanager):
    post(alertmanager,
         rule_labels(names.ALERT_MFU_IMPOSSIBLE) | run_labels("l20x", role="actor"),
         rule_labels(names.ALERT_MFU_DROP) | run_labels("l20x", role="actor"),
         rule_labels(names.ALERT_MFU_DROP) | run_labels("h200", role="actor"))
    want = {names.ALERT_MFU_IMPOSSIBLE: "active", names.ALERT_MFU_DROP: "suppressed"}
    assert states(alertmanager, "l20x", want) == want
    assert states(alertmanager, "h200", {names.ALERT_MFU_DROP: "active"}) == {names.ALERT_MFU_DROP: "active"}


def test_training_stalled_inhibits_step_alerts_of_its_run_only(alertmanager):
    step_alerts = sorted({a.name for a in ALERTS if a.labels.get("persistence") == "steps"})
    assert len(step_alerts) >= 6
    post(alertmanager, rule_labels(names.ALERT_STALLED) | run_labels("stalled"),
         *(rule_labels(n) | run_labels("stalled", role="actor") for n in step_alerts),
         rule_labels(names.ALERT_REWARD_BOUND) | run_labels("still_running"))
    want = {names.ALERT_STALLED: "active"} | {n: "suppressed" for n in step_alerts}
    assert states(alertmanager, "stalled", want) == want
    assert states(alertmanager, "still_running", {names.ALERT_REWARD_BOUND: "active"}) == \
        {names.ALERT_REWARD_BOUND: "active"}


def test_a_named_cause_inhibits_step_time_regression(alertmanager):
    post(alertmanager, rule_labels(names.ALERT_REWARD_BOUND) | run_labels("slow_reward"),
         rule_labels("StepTimeRegression") | run_labels("slow_reward"),
         rule_labels("StepTimeRegression") | run_labels("slow_unknown"))
    want = {names.ALERT_REWARD_BOUND: "active", "StepTimeRegression": "suppressed"}
    assert states(alertmanager, "slow_reward", want) == want
    assert states(alertmanager, "slow_unknown", {"StepTimeRegression": "active"}) == {"StepTimeRegression": "active"}


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
