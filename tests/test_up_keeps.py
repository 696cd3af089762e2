"""`omniwatch up` run again keeps what it was given (issue 35 item 12): a re-run that adds one flag, from a shell
without OMNIWATCH_SLACK_URL and without --watch, keeps Slack and the watched root, says what changed and what it
kept; a setting given again replaces it; --reset forgets and says what it dropped. The stack is real (Prometheus,
Alertmanager, the exporter) and Slack is a local receiver that an alert must reach after the re-run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from argparse import Namespace

import httpx
import pytest

from omniwatch import upkeep

from .conftest import fixture_path, free_port, require_binary, wait_for

SLACK = "OMNIWATCH_SLACK_URL"


def test_a_setting_given_again_replaces_it_the_rest_is_kept_and_said():
    kept = {"exporter_port": 20001, "watch": ["/a"], "notify": {"env": [SLACK]}, "profile": "fast"}
    now = {"trainer_config": ["/cfg"]}
    merged = upkeep.merge(kept, now)
    assert merged == {**kept, "trainer_config": ["/cfg"]}
    changed, names = upkeep.changes(kept, merged, now)
    assert changed == ["--trainer-config: nothing -> /cfg"]
    assert names == ["--exporter-port", "--profile", "--watch", f"notify ({SLACK})"]
    # the right path replaces a typo; --reset keeps only what is given now and says what went
    merged = upkeep.merge(kept, {"watch": ["/b"]})
    assert merged["watch"] == ["/b"] and upkeep.changes(kept, merged, {"watch": ["/b"]})[0] == ["--watch: /a -> /b"]
    merged = upkeep.merge(kept, {"watch": ["/b"]}, reset=True)
    assert merged == {"watch": ["/b"]}
    assert f"notify: {SLACK} -> nowhere (omniwatch alerts only)" in upkeep.changes(kept, merged, {"watch": ["/b"]})[0]
    # control: a first `up` has nothing to keep
    assert upkeep.merge({}, now) == now


def test_ports_from_the_environment_count_as_given(monkeypatch):
    args = Namespace(exporter_port=None, prometheus_port=31000, alertmanager_port=None, grafana_port=None,
                     watch=[], console=[], checkpoint_root=[], trainer_config=[], profile=None, exporter_bind=None,
                     receivers=None)
    assert upkeep.given(args) == {"prometheus_port": 31000}
    monkeypatch.setenv("OMNIWATCH_EXPORTER_PORT", "31001")
    assert upkeep.given(args) == {"prometheus_port": 31000, "exporter_port": 31001}


def _ow(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniwatch", *args], capture_output=True, text=True, timeout=180,
                          env=env)


@pytest.mark.integration
def test_up_again_with_one_flag_keeps_slack_and_the_watched_root(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    from .relay_support import Receiver
    slack = Receiver().start()
    run_dir = tmp_path / ".omniwatch"
    ports = {"--prometheus-port": free_port(), "--alertmanager-port": free_port(), "--exporter-port": free_port(),
             "--grafana-port": free_port()}
    flags = ["--run-dir", str(run_dir)] + [str(x) for kv in ports.items() for x in kv]
    root = tmp_path / "verl-logs"
    (root / "p").mkdir(parents=True)
    (root / "p" / "e.jsonl").write_text(fixture_path("flowgrpo_healthy").read_text().splitlines(keepends=True)[0])
    cfgs = tmp_path / "outputs"
    cfgs.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMNIWATCH_")}
    url = f"{slack.url}/services/T1/B1/secret"
    exporter = f"http://127.0.0.1:{ports['--exporter-port']}"
    try:
        first = _ow("up", *flags, "--profile", "fast", "--watch", str(root), env={**base, SLACK: url})
        assert first.returncode == 0, first.stdout + first.stderr
        assert "slack (slack): ok" in first.stdout and "changed" not in first.stdout, first.stdout
        assert url not in (run_dir / "up.json").read_text()  # the URL is kept as a secret, not in up.json
        assert oct((run_dir / "secrets" / "env" / SLACK).stat().st_mode & 0o777) == "0o600"

        # the re-run: one more flag, no Slack variable, no --watch, no --profile, no ports (they were given once)
        again = _ow("up", "--run-dir", str(run_dir), "--trainer-config", str(cfgs), env=base)
        assert again.returncode == 0, again.stdout + again.stderr
        out = again.stdout
        assert f"--trainer-config: nothing -> {cfgs}" in out, out
        assert "kept" in out and "--watch" in out and f"notify ({SLACK})" in out, out
        assert "restarted with the new configuration: exporter)" in out, out
        assert "slack (slack): ok" in out and "DISABLED" not in out, out
        assert "WARNING" not in again.stderr, again.stderr
        argv = json.loads((run_dir / "pids" / "exporter.json").read_text())["argv"]
        assert argv[argv.index("--watch") + 1] == str(root) and str(cfgs) in argv, argv
        assert exporter in out  # the same port
        # Slack still gets the alerts: one sent to Alertmanager reaches the receiver through the restarted relay
        am = f"http://127.0.0.1:{ports['--alertmanager-port']}"
        alert = [{"labels": {"alertname": "UpKeepsSlack", "severity": "warning", "project": "p", "experiment": "e"},
                  "annotations": {"summary": "kept"}, "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
        httpx.post(f"{am}/api/v2/alerts", json=alert, timeout=5).raise_for_status()
        wait_for(lambda: [m for m in slack.accepted if "UpKeepsSlack" in json.dumps(m["body"])], timeout=60,
                 what="the alert at the Slack receiver after the re-run")

        # a setting given again replaces it (a typo fixed), said
        other = tmp_path / "verl-logs-2"
        third = _ow("up", "--run-dir", str(run_dir), "--watch", str(other), env=base)
        assert third.returncode == 0, third.stdout + third.stderr
        assert f"--watch: {root} -> {other}" in third.stdout, third.stdout
        # --reset forgets, and says that Slack is no longer told
        fourth = _ow("up", "--run-dir", str(run_dir), "--reset", *flags[2:], "--profile", "fast", env=base)
        assert fourth.returncode == 0, fourth.stdout + fourth.stderr
        assert f"notify: {SLACK} -> nowhere" in fourth.stdout and "--watch: " in fourth.stdout, fourth.stdout
        assert "slack (?): DISABLED: not in the relay config" in fourth.stdout, fourth.stdout
        assert "WARNING" not in fourth.stderr, fourth.stderr  # dropped when told: no warning
    finally:
        _ow("down", "--run-dir", str(run_dir), env=base)
        slack.stop()
