"""Prometheus at scale, for real: an agent-mode Prometheus (deploy/scale/agent.yml) scrapes the
exporter fed with the reward-bound fixture and remote-writes to a central Prometheus
(deploy/scale/central.yml, remote-write receiver) that evaluates alerts/*.rules.yml; the series are
queryable centrally and RewardBoundRollout fires there. The committed configs are the ones run
(only addresses and intervals are rewritten for loopback); promtool checks them as written."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from conftest import REPO, fixture_path, require_binary
from omniwatch import names as n
from omniwatch.core.parse import parse_jsonl_line
from omniwatch.rules import rule_files
from omniwatch.httpguard import BackgroundServer
from omniwatch.server import Exporter
from omniwatch.settings import Settings
from scale_support import Prometheus, poll
from omniwatch.yamlio import load as yaml_load

SCALE = REPO / "deploy" / "scale"
PROJECT, EXPERIMENT = "scale", "reward_bound"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_scale_configs_pass_promtool(tmp_path):
    promtool = require_binary("promtool")
    for args in (["--agent", str(SCALE / "agent.yml")], [str(SCALE / "central.yml")]):
        res = subprocess.run([promtool, "check", "config", *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
    fed = yaml_load((SCALE / "federate.yml").read_text())
    job = fed["scrape_configs"][0]
    assert job["metrics_path"] == "/federate" and job["honor_labels"] is True
    assert '{__name__=~"project_experiment.*:.*"}' in job["params"]["match[]"]
    f = tmp_path / "federate.yml"
    f.write_text(yaml.safe_dump({"global": {"scrape_interval": "30s"}, **fed}))
    res = subprocess.run([promtool, "check", "config", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def exporter():
    settings = Settings.from_env(port=0)
    settings.extra.update(discovery=False, gpu="off")
    ex = Exporter.build(settings)
    for line in fixture_path("flowgrpo_reward_bound").read_bytes().splitlines():
        if line.strip():
            ex.store.ingest(PROJECT, EXPERIMENT, parse_jsonl_line(line), "jsonl", feed=EXPERIMENT)
    srv = BackgroundServer(ex.app).start()
    try:
        yield srv
    finally:
        srv.stop()
        ex.stop()


def central_config() -> dict:
    cfg = yaml_load((SCALE / "central.yml").read_text())
    cfg["global"].update(evaluation_interval="1s", scrape_interval="1s")
    cfg["rule_files"] = [str(p) for p in rule_files()]
    cfg.pop("alerting")  # no Alertmanager in this test: the alert state is read from /api/v1/alerts
    return cfg


def agent_config(exporter: str, central: str) -> dict:
    cfg = yaml_load((SCALE / "agent.yml").read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s")
    for job in cfg["scrape_configs"]:
        for sc in job.get("static_configs", []):
            sc["targets"] = [exporter]
        for sd in job.get("http_sd_configs", []):
            sd["url"] = sd["url"].replace("omniwatch-exporter.example:19095", exporter)
            sd["refresh_interval"] = "1s"
    (rw,) = cfg["remote_write"]
    rw["url"] = f"http://{central}/api/v1/write"
    rw["queue_config"]["batch_send_deadline"] = "1s"
    return cfg


def test_agent_remote_writes_and_central_rules_fire(exporter, tmp_path):
    require_binary("prometheus")
    central = Prometheus(central_config(), tmp_path / "central", args=("--web.enable-remote-write-receiver",))
    agent = None
    try:
        central.start()
        central_addr = central.addr
        # central.yml scrapes "itself" at a placeholder address: point it at the real port.
        agent = Prometheus(agent_config(f"{exporter.host}:{exporter.port}", central_addr), tmp_path / "agent",
                           args=("--enable-feature=agent",)).start()
        cluster = yaml_load((SCALE / "agent.yml").read_text())["global"]["external_labels"]["cluster"]
        got = poll(lambda: central.query(f'{n.REWARD_BOUND_WINDOW}{{project="{PROJECT}",stat="min"}}'), 60)
        assert got, "remote-written series never reached the central Prometheus"
        assert got[0]["metric"]["cluster"] == cluster and got[0]["metric"]["job"] == "omniwatch"
        assert poll(lambda: central.query('up{job="omniwatch"} == 1'), 30)
        firing = poll(lambda: central.alerts(n.ALERT_REWARD_BOUND, "firing"), 90)
        assert firing, f"{n.ALERT_REWARD_BOUND} did not fire centrally; alerts: {central.alerts()}"
        assert firing[0]["labels"]["project"] == PROJECT and firing[0]["labels"]["experiment"] == EXPERIMENT
        assert agent.metric("prometheus_remote_storage_samples_total") or \
            agent.metric("prometheus_remote_storage_succeeded_samples_total")
    finally:
        if agent:
            agent.stop()
        central.stop()
