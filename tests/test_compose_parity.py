"""The compose path takes what the native path takes (issue 27 item 3): the same published ports (and
the same OMNIWATCH_*_PORT variables), WATCH as the log root, Slack/Feishu/webhook URLs from the same
variables through an optional-receivers file the relay loads as it does for `omniwatch up`."""
from __future__ import annotations

import re

import yaml

from omniwatch import settings
from omniwatch.relay import config as relay_config

from .conftest import REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
RECEIVERS = REPO / "deploy" / "compose" / "receivers.yml"


def _published(service: str) -> tuple[str, str]:
    (port,) = COMPOSE["services"][service]["ports"]
    m = re.fullmatch(r"127\.0\.0\.1:\$\{(OMNIWATCH_[A-Z]+_PORT):-(\d+)\}:\d+", port)
    assert m, port
    return m.group(1), m.group(2)


def test_compose_publishes_the_native_ports_under_the_same_variables():
    assert _published("prometheus") == ("OMNIWATCH_PROMETHEUS_PORT", str(settings.DEFAULT_PROMETHEUS_PORT))
    assert _published("alertmanager") == ("OMNIWATCH_ALERTMANAGER_PORT", str(settings.DEFAULT_ALERTMANAGER_PORT))
    assert _published("exporter") == ("OMNIWATCH_EXPORTER_PORT", str(settings.DEFAULT_EXPORTER_PORT))
    assert _published("grafana") == ("OMNIWATCH_GRAFANA_PORT", str(settings.DEFAULT_GRAFANA_PORT))


def test_compose_tails_watch_and_relays_to_the_urls_of_the_native_path():
    ex = COMPOSE["services"]["exporter"]
    assert "${WATCH:-${OMNIWATCH_LOG_DIR:-./logs}}:/data/logs:ro" in ex["volumes"]
    assert "--watch=/data/logs" in ex["command"]
    mount = next(v for v in ex["volumes"] if v.endswith(":/etc/omniwatch/receivers.yml:ro"))
    assert mount.startswith("${RECEIVERS:-./deploy/compose/receivers.yml}")
    env = ex["environment"]
    assert env["OMNIWATCH_RELAY_CONFIG"] == "/etc/omniwatch/receivers.yml"
    for var in ("OMNIWATCH_SLACK_URL", "OMNIWATCH_FEISHU_URL", "OMNIWATCH_NOTIFY_WEBHOOK_URL"):
        assert env[var] == "${" + var + ":-}"   # passed through, never a literal URL
    make = (REPO / "Makefile").read_text()
    assert "WATCH='$(firstword $(WATCH))'" in make and "OMNIWATCH_SLACK_URL='$(SLACK_URL)') \\\n\t\t\t$(if $(RECEIVERS)" in make


def test_the_compose_receivers_file_yields_only_the_receivers_whose_url_is_set(monkeypatch, tmp_path):
    cfg = relay_config.load(str(RECEIVERS))
    assert cfg.error is None and cfg.receivers == []          # nothing set: no receiver, no error
    monkeypatch.setenv("OMNIWATCH_SLACK_URL", "http://127.0.0.1:9/services/T/B/X")
    monkeypatch.setenv("OMNIWATCH_FEISHU_URL", "")              # compose passes unset ones as empty
    cfg = relay_config.load(str(RECEIVERS))
    assert [(r.name, r.type, r.enabled) for r in cfg.receivers] == [("slack", "slack", True)]
    # the every-minute Watchdog heartbeat is not sent to the channel; the run alerts are
    (slack,) = cfg.receivers
    assert not slack.wants("firing", {"alertname": "Watchdog", "severity": "none"})
    assert slack.wants("firing", {"alertname": "RewardBoundRollout", "project": "p", "experiment": "e"})
    # a receiver that is not optional still says what is missing
    plain = RECEIVERS.read_text().replace("    optional: true\n", "")
    p = tmp_path / "receivers.yml"
    p.write_text(plain)
    errs = {r.name: r.error for r in relay_config.load(str(p)).receivers}
    assert errs["slack"] is None and "OMNIWATCH_FEISHU_URL" in errs["feishu"]
