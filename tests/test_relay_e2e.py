"""End to end: a real Alertmanager 0.25 -> the exporter (uvicorn, separate process) -> a loopback
receiver that is down for a while; the exporter is killed (SIGKILL) and later stopped (SIGTERM) and
restarted on the same state dir and port. Every message must arrive exactly once, in order per group."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import httpx
import pytest

from conftest import require_binary
from relay_support import Receiver, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "e2e-webhook-token-abcdef"
HOOK_SECRET = "e2eHOOKsecretPATHvalue77"

LAUNCHER = textwrap.dedent("""
    import sys, uvicorn
    from omniwatch import app as app_mod
    from omniwatch.relay import api as relay_api
    app_mod.AREAS = (relay_api,)  # this area only; other areas test their own routers
    from omniwatch.core.exposition import make_registry
    from omniwatch.core.model import RunStore
    from omniwatch.settings import Settings
    store = RunStore()
    settings = Settings.from_env(state_dir=sys.argv[2])
    uvicorn.run(app_mod.create_app(store, make_registry(store), settings), host="127.0.0.1",
                port=int(sys.argv[1]), log_level="info")
""")


def _now(offset: float = 0.0) -> str:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset)).isoformat().replace("+00:00", "Z")


class Exporter:
    def __init__(self, tmp_path, port: int, env: dict):
        self.port, self.env, self.tmp = port, env, tmp_path
        self.state = str(tmp_path / "state")
        self.script = tmp_path / "launch_exporter.py"
        self.script.write_text(LAUNCHER)
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.runs += 1
        log = open(self.tmp / f"exporter{self.runs}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, str(self.script), str(self.port), self.state],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def up():
            assert self.proc.poll() is None, (self.tmp / f"exporter{self.runs}.log").read_text()
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, 30, 0.1, "exporter /healthz")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def get(self, path: str):
        return httpx.get(self.url + path, timeout=5).json()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("exporter*.log")))


@pytest.fixture
def alertmanager_factory(tmp_path):
    am_bin = require_binary("prometheus-alertmanager", "alertmanager")
    procs = []

    def start(webhook_url: str) -> str:
        token_file = tmp_path / "webhook.token"
        token_file.write_text(TOKEN)
        token_file.chmod(0o600)
        (tmp_path / "am.yml").write_text(textwrap.dedent(f"""
            route:
              receiver: relay
              group_by: [alertname, experiment]
              group_wait: 1s
              group_interval: 1s
              repeat_interval: 1h
            receivers:
              - name: relay
                webhook_configs:
                  - url: {webhook_url}
                    send_resolved: true
                    http_config:
                      authorization:
                        type: Bearer
                        credentials_file: {token_file}
        """))
        port = free_port()
        log = open(tmp_path / "alertmanager.log", "wb")
        p = subprocess.Popen([am_bin, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                              f"--web.external-url=http://127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        procs.append(p)
        url = f"http://127.0.0.1:{port}"

        def ready():
            assert p.poll() is None, (tmp_path / "alertmanager.log").read_text()
            try:
                return httpx.get(url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(ready, 30, 0.1, "alertmanager ready")
        return url

    try:
        yield start
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _alert(i: int, starts: str, ends: str | None = None) -> dict:
    a = {"labels": {"alertname": "RewardBoundRollout", "project": "flowgrpo", "experiment": f"exp{i}", "severity": "warning"},
         "annotations": {"summary": "Rollout is reward-bound.", "description": f"reward holds 6{i}% of the generation window.",
                         "step": str(200 + i), "remedy": "Give the reward model its own pool.",
                         "runbook_url": "https://example.invalid/runbooks.md#rewardboundrollout"},
         "startsAt": starts}
    if ends:
        a["endsAt"] = ends
    return a


def test_alertmanager_to_down_receiver_through_restarts_exactly_once(tmp_path, alertmanager_factory, capsys, monkeypatch):
    rcv = Receiver()                           # port reserved; nothing listens yet: connection refused
    relay_conf = tmp_path / "receivers.yml"
    relay_conf.write_text(textwrap.dedent("""
        receivers:
          - name: team-hook
            type: webhook
            url_env: OMNIWATCH_E2E_HOOK_URL
        retry: {initial_seconds: 0.1, max_seconds: 0.5, timeout_seconds: 3}
    """))
    env = {**os.environ, "OMNIWATCH_WEBHOOK_TOKEN": TOKEN, "OMNIWATCH_RELAY_CONFIG": str(relay_conf),
           "OMNIWATCH_E2E_HOOK_URL": f"{rcv.url}/hook/{HOOK_SECRET}", "PYTHONPATH": os.pathsep.join(sys.path)}
    exp = Exporter(tmp_path, free_port(), env)
    try:
        exp.start()
        am = alertmanager_factory(exp.url + "/api/v1/alertmanager")
        starts = _now(-60)

        def post(alerts):
            r = httpx.post(am + "/api/v2/alerts", json=alerts, timeout=5)
            assert r.status_code == 200, r.text

        def stored(n_):
            return lambda: len(exp.get("/api/v1/alerts?limit=1000")) >= n_

        # Phase A: 3 groups fire while the receiver is down; the exporter is SIGKILLed with them queued,
        # 2 more groups fire while the exporter is down (Alertmanager retries), then it comes back.
        post([_alert(i, starts) for i in range(3)])
        wait_for(stored(3), 60, 0.1, "3 notifications stored")
        wait_for(lambda: (exp.get("/api/v1/relay/status")["receivers"][0]["last_error"] or "").startswith("ConnectError"),
                 30, 0.1, "a refused delivery attempt")
        exp.stop(signal.SIGKILL)
        post([_alert(i, starts) for i in range(3, 5)])
        exp.start()
        wait_for(stored(5), 60, 0.1, "5 notifications stored after the restart")
        assert exp.get("/api/v1/relay/status")["receivers"][0]["pending"] == 5

        # Phase B: the receiver comes up answering 503; all 5 resolve; the exporter is stopped
        # (SIGTERM) and restarted while nothing is deliverable; then the receiver recovers.
        rcv.default = 503
        rcv.start()
        post([_alert(i, starts, _now()) for i in range(5)])
        wait_for(lambda: len(exp.get("/api/v1/alerts?status=resolved")) >= 5, 60, 0.1, "5 resolved stored")
        wait_for(lambda: len(rcv.requests) >= 2, 30, 0.05, "503 answers")
        exp.stop(signal.SIGTERM)
        exp.start()
        rcv.default = 200
        got = rcv.wait_accepted(10, timeout=60)
        wait_for(lambda: exp.get("/api/v1/relay/status")["receivers"][0]["delivered"] == 10, 30, 0.1, "10 delivered")

        # Alertmanager keeps flushing groups (group_interval 1s): give it a few rounds to re-send anything.
        time.sleep(3)
        assert len(rcv.accepted) == 10, [r["body"]["title"] for r in rcv.accepted]

        ids = Counter(r["headers"]["x-omniwatch-delivery-id"] for r in got)
        assert len(ids) == 10 and set(ids.values()) == {1}
        per_group = {}
        for r in rcv.accepted:
            b = r["body"]
            assert b["deliveryId"] == r["headers"]["x-omniwatch-delivery-id"]
            per_group.setdefault(b["alerts"][0]["run"], []).append(b["status"])
        assert per_group == {f"flowgrpo/exp{i}": ["firing", "resolved"] for i in range(5)}
        fired = next(r["body"] for r in rcv.accepted if r["body"]["alerts"][0]["run"] == "flowgrpo/exp4")
        assert fired["alerts"][0]["step"] == "204" and "64%" in fired["text"] and "Remedy:" in fired["text"]

        status = exp.get("/api/v1/relay/status")
        r0 = status["receivers"][0]
        assert (r0["pending"], r0["delivered"], r0["failed"]) == (0, 10, 0)
        assert status["notifications"] == 10
        metrics = httpx.get(exp.url + "/metrics", timeout=5).text
        assert 'omniwatch_relay_pending{receiver="team-hook"} 0.0' in metrics
        assert 'omniwatch_relay_deliveries_total{receiver="team-hook",result="ok"}' in metrics

        # the CLI reads the same API
        from omniwatch.relay.commands import add_commands
        p = argparse.ArgumentParser()
        add_commands(p.add_subparsers())
        capsys.readouterr()
        args = p.parse_args(["alerts", "--url", exp.url, "--limit", "3", "--json"])
        assert args.func(args) == 0
        out = json.loads(capsys.readouterr().out)
        assert len(out["alerts"]) == 3 and out["relay"]["receivers"][0]["delivered"] == 10
        monkeypatch.setenv("COLUMNS", "200")  # rich sizes the table to the terminal
        args = p.parse_args(["alerts", "--url", exp.url, "--limit", "5"])
        assert args.func(args) == 0
        table = capsys.readouterr().out
        assert "RewardBoundRollout" in table and "team-hook" in table
        bad = p.parse_args(["alerts", "--url", f"http://127.0.0.1:{free_port()}"])
        assert bad.func(bad) == 1

        for text in (json.dumps(status), metrics, json.dumps(exp.get("/api/v1/alerts?limit=1000")), exp.logs()):
            assert HOOK_SECRET not in text and TOKEN not in text
    finally:
        exp.stop(signal.SIGKILL)
        rcv.stop()
